"""graph-layers' runtime: a graphed layer's state, the positional adapter that
_graph_capture.py captures, and the forward set on each graphed layer's instance, which
routes a call whose arguments match the capture to the graphs and any other to the layer's own
forward (graph_layers.py finds, captures, checks and times the layers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ._bias_grad import gemv_bias_grads
from ._graph_calls import TENSOR, Call, meta
from ._graph_check import Bypass as _Bypass

MARK = "_gpushape_graph_layers"  # the per-layer state, in the layer's __dict__


class LayerState:
    """A graphed layer: what it was captured with, the graphed callable, the output structure,
    its parameters and the addresses of their gradient buffers. A copy (deepcopy, pickle) is
    stale: the copied layer runs its own forward."""

    def __init__(self, call: Call | None, graphed: Callable | None, out_spec: Any = None):
        self.call, self.graphed, self.out_spec = call, graphed, out_spec
        self.out_constants: list = []
        self.params: list[nn.Parameter] = []
        self.static: set[int] = set()  # addresses of the graph's gradient buffers
        self.adapter: nn.Module | None = None  # what the capture (_graph_capture.py) took
        self.linked: dict[int, int] = {}  # tensor argument -> the address it must arrive at
        # (an earlier layer's output, read in place by the graphs)
        self.copied = 0  # bytes the replays copy into the graphs a step, both passes
        self.gemv_weights: set[int] = set()  # ids of the weights of the Linears whose bias
        # gradient the graphs take by a GEMV

    def release(self) -> None:
        """Drop the graphs. The capture sets the replaying forward on the adapter, a closure
        over an autograd Function class (a class is a reference cycle by nature): only the
        garbage collector frees it, with the graphs' memory pool and the autograd nodes their
        capture made (on the capture's side stream, where they make every later backward wait
        across streams)."""
        if self.adapter is not None:
            self.adapter.__dict__.pop("forward", None)
        self.adapter = self.graphed = None

    def __deepcopy__(self, memo):
        return LayerState(None, None)

    def __reduce__(self):
        return (LayerState, (None, None))


class Positional(nn.Module):
    """The layer as the capture needs it: tensors in, a tuple of tensors out. Holds the layer
    as its child so that the capture sees its parameters."""

    def __init__(self, layer: nn.Module, call: Call, state: LayerState):
        super().__init__()
        self.layer, self.call, self.state = layer, call, state

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(tensors)
        leaves = [next(it) if c is TENSOR else c for c in self.call.constants]
        args, kwargs = pytree.tree_unflatten(leaves, self.call.spec)
        out = type(self.layer).forward(self.layer, *args, **kwargs)
        out_leaves, self.state.out_spec = pytree.tree_flatten(out)
        self.state.out_constants = [
            TENSOR if isinstance(t, torch.Tensor) else t for t in out_leaves
        ]
        return tuple(t for t in out_leaves if isinstance(t, torch.Tensor))


class GraphedForward:
    """A graphed layer's forward, set on the instance. Copies and pickles of the layer get one
    too, bound to the copy, whose state is stale: the copy runs its own forward."""

    def __init__(self, layer: nn.Module):
        self.layer = layer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _forward(self.layer, *args, **kwargs)


def _forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    state: LayerState = self.__dict__[MARK]
    tensors = _matching(self, state, args, kwargs)
    if tensors is None:
        if state.gemv_weights and not _Bypass.on and _capturing():
            # a whole step captured around the layer (cuda-graphs after graph-layers) runs it
            # eagerly into its own graph: with the layer's bias gradients by the same GEMV, else
            # that graph's backward ran slower than the layers' replays (on an H100, 0.3-1.4 ms
            # a step of ViT-B/16, Swin-T, ConvNeXt-T; benchmarks/results/loops-h100-22)
            with gemv_bias_grads(only=state.gemv_weights):
                return type(self).forward(self, *args, **kwargs)
        return type(self).forward(self, *args, **kwargs)
    own_gradients(state)
    outs = iter(state.graphed(*tensors))
    leaves = [next(outs) if c is TENSOR else c for c in state.out_constants]
    return pytree.tree_unflatten(leaves, state.out_spec)


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def own_gradients(state: LayerState) -> None:
    """Before a replay: a parameter whose .grad is still the graph's gradient buffer (kept from
    the last backward by zeroing in place, or by accumulating over micro-batches) gets a copy,
    which the replay's backward then adds to; otherwise the replay would overwrite it.

    The replay hands each parameter's gradient to autograd as a view of the graph's buffer,
    and autograd keeps that view as .grad when .grad was None. With the gradients set to None
    between steps (zero_grad's default) nothing is copied. Checked here, on the calling
    thread, by address: no hook runs in autograd's worker thread, where Python is slow."""
    static = state.static
    for p in state.params:
        g = p.grad
        if g is not None and g.data_ptr() in static:
            p.grad = g.clone()


def _matching(layer, state: LayerState, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
    """The call's tensors when it can replay the graphs, else None."""
    call = state.call
    if (
        call is None
        or _Bypass.on
        or not layer.training
        or not torch.is_grad_enabled()
        or torch.compiler.is_compiling()
        or torch.is_autocast_enabled("cuda")
        or torch.cuda.is_current_stream_capturing()
    ):
        return None
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if spec != call.spec:
        return None
    tensors, i = [], 0
    for leaf, const in zip(leaves, call.constants):
        if isinstance(leaf, torch.Tensor):
            if (
                const is not TENSOR
                or type(leaf) is not torch.Tensor
                or meta(leaf) != call.tensors[i]
            ):
                return None
            if i in state.linked and leaf.data_ptr() != state.linked[i]:
                return None  # not the earlier layer's output: the graphs would overwrite it
            tensors.append(leaf)
            i += 1
        elif const is not leaf and (
            const is TENSOR or type(const) is not type(leaf) or const != leaf
        ):
            return None
    return tensors


def is_graphed(layer: nn.Module) -> bool:
    state = layer.__dict__.get(MARK)
    return isinstance(state, LayerState) and state.graphed is not None
