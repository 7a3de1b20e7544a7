"""graph-layers' capture: each layer's forward and backward as a pair of CUDA graphs, all in one
memory pool, with a layer that reads another captured layer's output reading it where it lies.

A CUDA graph reads its inputs from the addresses it was captured with, so a replayed layer first
copies each input into its graph's own buffer, and its backward the incoming gradients likewise
(what `torch.cuda.make_graphed_callables` does, the semantics kept here). In a stack of layers
each layer's input is the previous layer's output, which already lies in a graph's buffer: the
copies move every activation twice more a step, both ways. On an H100, ResNet-50-GN's 16 graphed
bottlenecks spent 0.85 ms a step of GPU time on them (26.3 against 25.5 ms of GPU work;
benchmarks/results/loops-h100-29), more than replaying saved the host on that GPU-bound step.

Here a layer whose input was, in the observed forward, the output of a layer captured before it
(`links`) is captured reading that output's buffer, and the earlier layer's backward is captured
reading the later one's input gradient: in a chain of layers only the first input and the last
output gradient are copied. The replayed forward refuses a linked input at another address (it
would overwrite the earlier layer's output); graph-layers' forward runs such a call eagerly.

The passes are captured as they run in a training step (forwards in order, then backwards in
reverse), so replays sharing the pool never reuse memory another pass still needs; each layer
first runs a few times eagerly on a side stream (cuDNN's and cuBLAS's first-call work, kept out
of the graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils import _pytree as pytree

Link = tuple[int, int]  # (layer, output): a tensor one layer returns, by their positions
WARMUP = 3


@dataclass
class _Graphs:
    """One layer's captured passes and the tensors they read and write, at fixed addresses."""

    forward: torch.cuda.CUDAGraph
    backward: torch.cuda.CUDAGraph
    inputs: tuple  # the layer's tensor arguments, then its parameters
    n_args: int
    linked: frozenset[int]  # arguments read in place: another layer's output buffer
    outputs: tuple = ()
    grad_outputs: tuple = ()  # per output: its gradient's buffer, None where it needs none
    grad_inputs: tuple = ()  # per input: its gradient (a buffer of the pool), or None
    copied: int = 0  # bytes copied into the graphs a step: unlinked inputs and gradients


def _meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


def graphed_callables(
    callables: Sequence[nn.Module],
    samples: Sequence[tuple[torch.Tensor, ...]],
    links: dict[tuple[int, int], Link] | None = None,
) -> tuple[nn.Module, ...]:
    """Capture each module (tensors in, a tuple of tensors out) on its sample arguments; returns
    the modules with `forward` replaced by the replay (as make_graphed_callables does), each
    with `graph_links` (argument index -> the address it must arrive at) and `graph_copied`
    (bytes its replays copy a step). `links[(i, k)] = (j, m)`: module i's argument k is module
    j's output m (j < i)."""
    links = dict(links or {})
    params = [tuple(c.parameters()) for c in callables]
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for c, args, ps in zip(callables, samples, params):
            for _ in range(WARMUP):
                outs = [t for t in c(*args) if t.requires_grad]
                if outs:
                    torch.autograd.grad(
                        outs,
                        [t for t in (*args, *ps) if t.requires_grad],
                        [torch.empty_like(t) for t in outs],
                        allow_unused=True,
                    )
                del outs
    torch.cuda.synchronize()
    graphs: list[_Graphs] = []
    for i, (c, args) in enumerate(zip(callables, samples)):
        args = list(args)
        linked = set()
        for k, t in enumerate(args):
            j, m = links.get((i, k), (None, None))
            if j is None or j >= i or m >= len(graphs[j].outputs):
                links.pop((i, k), None)
                continue
            out = graphs[j].outputs[m]
            if _meta(out) != _meta(t) or not (t.requires_grad and out.requires_grad):
                links.pop((i, k), None)
                continue
            args[k] = out.detach().requires_grad_(True)
            linked.add(k)
        g = _Graphs(
            torch.cuda.CUDAGraph(),
            torch.cuda.CUDAGraph(),
            (*args, *params[i]),
            len(args),
            frozenset(linked),
        )
        with torch.cuda.graph(g.forward, pool=pool, stream=stream):
            outs = c(*args)
        g.outputs = tuple(outs)
        graphs.append(g)
    consumers: dict[Link, list] = {}
    for (i, k), src in links.items():
        consumers.setdefault(src, []).append((i, k))
    for i in reversed(range(len(graphs))):
        g = graphs[i]
        grad_outputs = []
        for m, o in enumerate(g.outputs):
            if not o.requires_grad:
                grad_outputs.append(None)
                continue
            users = consumers.get((i, m), [])
            buf = graphs[users[0][0]].grad_inputs[users[0][1]] if len(users) == 1 else None
            if buf is None or _meta(buf) != _meta(o):
                buf = torch.empty_like(o)
                g.copied += o.nbytes
            grad_outputs.append(buf)
        g.grad_outputs = tuple(grad_outputs)
        wanted = [t for t in g.inputs if t.requires_grad]
        needed = [o for o in g.outputs if o.requires_grad]
        grads: Sequence = ()
        if needed:
            with torch.cuda.graph(g.backward, pool=pool, stream=stream):
                grads = torch.autograd.grad(
                    needed,
                    wanted,
                    [b for b in g.grad_outputs if b is not None],
                    allow_unused=True,
                )
        it = iter(grads)
        g.grad_inputs = tuple(
            next(it, None) if t.requires_grad and needed else None for t in g.inputs
        )
        g.copied += sum(g.inputs[k].nbytes for k in range(g.n_args) if k not in g.linked)
    for c, g in zip(callables, graphs):
        c.forward = _replay(g)
        c.graph_links = {k: g.inputs[k].data_ptr() for k in g.linked}
        c.graph_copied = g.copied
    return tuple(callables)


def _replay(g: _Graphs):
    """The replayed forward: the graphs as an autograd Function over the arguments and the
    parameters (their gradients the backward graph's buffers)."""

    class Replayed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for k in range(g.n_args):
                static, given = g.inputs[k], inputs[k]
                if static.data_ptr() == given.data_ptr():
                    continue
                if k in g.linked:
                    raise RuntimeError(
                        f"graph-layers: argument {k} must be the previous layer's output, read "
                        "in place; another tensor would overwrite that output"
                    )
                static.copy_(given)
            g.forward.replay()
            return tuple(o.detach() for o in g.outputs)

        @staticmethod
        @once_differentiable
        def backward(ctx, *grads):
            for static, grad in zip(g.grad_outputs, grads):
                if static is not None and static.data_ptr() != grad.data_ptr():
                    static.copy_(grad)
            g.backward.replay()
            return tuple(None if t is None else t.detach() for t in g.grad_inputs)

    def forward(*args):
        flat = pytree.tree_leaves(args)
        return Replayed.apply(*flat, *g.inputs[g.n_args :])

    return forward
