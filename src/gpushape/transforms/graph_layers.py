"""graph-layers: the repeated layers of a model replay their forward and backward from CUDA graphs,
while the training loop stays eager.

An eager training step costs the host a few tens of microseconds per op (dispatch, launch, the
autograd engine's bookkeeping in backward). Where the GPU runs the step faster than the host
issues it (BERT-base at 32 x 512 on an H200 once its vocabulary GEMM and masked-LM head are
fixed: ~29 ms of kernels, ~35 ms of host), every microsecond of host time is wall time. A layer
replayed from a CUDA graph costs the host one launch per pass, whatever it runs. This is what
PyTorch's `torch.cuda.make_graphed_callables` does (and Megatron-LM and Transformer Engine for
their layers), applied to the layers of a model nobody wrote for it:

- Found from the model, not from names: a ModuleList (or Sequential) of two or more children of
  one class, each called once per forward. The model runs once on the example inputs (on their
  CUDA device, in train mode) with hooks that note each layer's arguments: a tensor argument
  becomes a graph input (its shape, dtype and requires_grad are fixed), every other argument
  (None, a flag, a number) must be the same at each call.
- Each layer's forward is replaced on the instance: a call whose arguments match what was
  captured, in train mode, with autograd on, outside torch.compile, autocast and stream capture,
  replays the graphs; any other call (evaluation, another shape, a padding mask where none was
  captured) runs the layer's own forward. The module tree, the parameters (the same objects) and
  the state_dict are unchanged; an optimizer made before or after works alike.
- One memory pool for all layers, captured in order (`_graph_capture.py`); a layer whose input
  is the previous layer's output reads it in place, and the previous layer's backward reads the
  later one's input gradient likewise, where make_graphed_callables would copy both into its
  graphs' buffers (on an H100, 0.85 ms a step of ResNet-50-GN's GPU time). Random numbers
  (dropout) come from PyTorch's graph-safe generator, so a seed replays the same masks as
  eager code.

Caveats a user must know (the change's detail says them): a layer's outputs live in the graph's
memory and are overwritten by its next replay (a training step uses them before that; keep a copy
of a hidden state you hold across steps); a copy of the model (deepcopy, pickle) runs eagerly;
the first call after `optimize` is as fast as any other (capture happens inside it).

It pays where the host sets the pace, so `optimize()` applies it last in eager mode and keeps it
only where a measurement on the model's GPU says so: the layers alone, forward and backward,
replayed take at most `FASTER` of their eager time (CUDA events); asked for by name, it is
applied as asked. Not in compile mode (torch.compile's reduce-overhead mode does this itself)
nor in graph mode (the whole step is one graph already).

Checked before it is kept: the model's forward and backward on the example inputs, eager and
replayed from the graphs from the same random state, give the same outputs and gradients. A
capture that fails the check is dropped and made once more; failing again, it is refused.
"""

from __future__ import annotations

import gc

import torch
from torch import nn
from torch.utils import _pytree as pytree

from . import _graph_capture
from ._bias_grad import gemv_bias_grads
from ._core import (
    Change,
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    register_transform,
    state_restored,
)
from ._graph_calls import Call, layer_stacks, observe, plain, sample
from ._graph_check import layers_run, self_check, wall_seconds
from ._graph_replay import MARK, GraphedForward, LayerState, Positional, is_graphed

ID = "graph-layers"
FASTER = 0.97  # optimize keeps the graphs only if the layers replay in 97% of their eager time
# or less: a GPU-bound stack (ResNet-50 at batch 256 on an H200: 49.7 -> 49.4 ms) gains within
# noise, and its graphs' memory pool (8 GB there) is not worth it


# ---- the transform -----------------------------------------------------------------------------
def _refuse(out: Outcome, module: str, reason: str) -> Outcome:
    out.refusals.append(Refusal(transform=ID, module=module, reason=reason))
    return out


def _why_not(model: nn.Module, ctx: TransformContext) -> str | None:
    if ctx.mode != "eager":
        return (
            "graph mode captures the whole step already"
            if ctx.mode == "graph"
            else "torch.compile's reduce-overhead mode graphs the compiled layers itself"
        )
    if not ctx.train:
        return "graphs a training step's forward and backward; inference replays nothing here"
    params = list(model.parameters())
    if not params or any(p.device.type != "cuda" for p in params):
        return "needs the model on a CUDA GPU (it captures CUDA graphs)"
    leaves = [t for t in pytree.tree_leaves(ctx.example_inputs) if isinstance(t, torch.Tensor)]
    if not leaves or any(t.device.type != "cuda" for t in leaves):
        return "needs example inputs on the model's GPU (the graphs are captured for their shapes)"
    if not model.training:
        return "the model is in eval mode; the graphs replay only the mode they were captured in"
    return None


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    stacks = layer_stacks(model)
    if not stacks:
        return out
    why = _why_not(model, ctx)
    if why is not None:
        return _refuse(out, stacks[0][0], why)
    layers: dict[str, nn.Module] = {}
    for _container, members in stacks:
        for name, layer in members:
            if is_graphed(layer) or not ctx.allows(layer, name):
                continue
            reason = (
                "it has hooks, which a replay would skip"
                if has_hooks(layer)
                else "its forward is already replaced on the instance"
                if "forward" in layer.__dict__
                else "a buffer requires grad"
                if any(b.requires_grad for b in layer.buffers())
                else None
            )
            if reason:
                _refuse(out, name, reason)
            else:
                layers[name] = layer
    if not layers:
        return out
    # observing, capturing (its warm-up), timing and checking run the model
    # in train mode: they leave its running statistics and the random generators as found
    with state_restored(model, ctx.example_inputs):
        return _apply_to(model, layers, ctx, out)


def _apply_to(model: nn.Module, layers: dict, ctx: TransformContext, out: Outcome) -> Outcome:
    try:
        calls = observe(model, layers, ctx.example_inputs)
    except Exception as exc:  # a model this cannot run is refused, never raised
        return _refuse(out, "", f"the model failed to run: {type(exc).__name__}: {exc}"[:300])
    picked = {}
    for name, layer in layers.items():
        seen = calls[name]
        odd = [c for c in seen[0].constants if not plain(c)] if len(seen) == 1 else []
        if len(seen) != 1:
            _refuse(out, name, f"called {len(seen)} times in one forward (graphed: exactly once)")
        elif not seen[0].tensors:
            _refuse(out, name, "takes no tensor")
        elif odd:
            kind = type(odd[0]).__name__
            why = f"each call passes it a {kind}, which a replay would not update"
            _refuse(
                out,
                name,
                f"{why} (a key/value cache: train with use_cache=False, which no-kv-cache does)",
            )
        else:
            picked[name] = (layer, seen[0])
    if not picked:
        return out
    error, out.measured = _capture(picked, ctx.measure)
    if error is None:
        error = self_check(model, ctx.example_inputs)
    if error is not None:  # once more, from a fresh capture that copies every input as
        # make_graphed_callables does (no layer reading another's output in place): on the H200
        # (2026-12-02) one build of BERT failed its check where the next build passed, cause
        # unknown; graphs are kept only when their own check passes
        _drop(picked)
        first = error
        error, measured = _capture(picked, ctx.measure and out.measured is None, linked=False)
        error = error or self_check(model, ctx.example_inputs)
        out.measured = out.measured or measured
        if error is not None:
            error = f"{error}; a first capture too: {first}"
    if error is not None:
        _drop(picked)
        return _refuse(out, next(iter(picked)), error)
    for name, (layer, call) in picked.items():
        gemv = len(layer.__dict__[MARK].gemv_weights)
        out.changes.append(
            Change(
                transform=ID,
                module=name,
                detail=(
                    f"forward and backward replayed from CUDA graphs for {len(call.tensors)} "
                    "input tensor(s) of the shapes captured (other calls run eagerly); outputs "
                    "live in the graphs' memory until the next step; copies of the model run "
                    "eagerly"
                    + (f"; {gemv} Linear bias gradient(s) by a cuBLAS GEMV" if gemv else "")
                ),
                undo=lambda layer=layer: _remove(layer),
            )
        )
    return out


def links_of(picked: dict[str, tuple[nn.Module, Call]]) -> dict[tuple[int, int], tuple]:
    """(layer, tensor argument) -> (layer, output), by the layers' positions in `picked`: the
    arguments that were, in the observed forward, the output of a layer captured before them
    (and require grad, as that output does), which the graphs read in place."""
    index = {name: i for i, name in enumerate(picked)}
    links = {}
    for i, (_layer, call) in enumerate(picked.values()):
        for k, source in enumerate(call.sources):
            j = index.get(source[0]) if source is not None else None
            if j is not None and j < i and call.tensors[k][4]:
                links[(i, k)] = (j, source[1])
    return links


def _capture(
    picked: dict[str, tuple[nn.Module, Call]], measure: bool, linked: bool = True
) -> tuple:
    """Capture every picked layer (_graph_capture.py: one memory pool, a layer's input read in
    place where it is an earlier layer's output, unless not `linked`): (None, None), or why
    not; with `measure`,
    (None, (the layers' eager forward and backward in seconds, and the same replayed)), which
    optimize keeps only if replayed is faster."""
    adapters, samples, states = [], [], []
    for layer, call in picked.values():
        state = LayerState(call, None)
        state.adapter = Positional(layer, call, state)
        adapters.append(state.adapter)
        samples.append(sample(call))
        states.append(state)
    links = links_of(picked) if linked else {}
    eager_s = None
    if measure:  # no profiler: eager against replayed decides, and the user's process is
        # spared a profiler session, which can leave CUPTI attached and later launches slower
        # (pytorch/pytorch#144455; ResNet-50's eager optimize ran erratically after one)
        eager_s = wall_seconds(layers_run(adapters, samples, links))
        for adapter in adapters:  # the parameter gradients these passes left
            adapter.zero_grad(set_to_none=True)
    rerouted = gemv_bias_grads()
    try:
        with rerouted:  # the graphs take Linear bias gradients by a GEMV (_bias_grad.py)
            graphed = _graph_capture.graphed_callables(tuple(adapters), tuple(samples), links=links)
    except Exception as exc:
        _release(states)
        return f"capture failed: {type(exc).__name__}: {_first_line(exc)}", None
    for (layer, _), adapter, state in zip(picked.values(), graphed, states):
        state.graphed = adapter.forward  # the graphed forward, without Module.__call__
        state.linked = dict(adapter.__dict__.get("graph_links", {}))
        state.copied = int(adapter.__dict__.get("graph_copied", 0))
        state.params = [p for p in layer.parameters() if p.requires_grad]
        linears = [m for m in layer.modules() if isinstance(m, nn.Linear)]
        state.gemv_weights = {id(m.weight) for m in linears if id(m.weight) in rerouted.weights}
        layer.__dict__[MARK] = state
        layer.forward = GraphedForward(layer)
    linked = {key: src for key, src in links.items() if key[1] in states[key[0]].linked}
    run = layers_run([state.graphed for state in states], samples, linked)
    _learn_gradient_buffers(states, run)
    if eager_s is None:
        return None, None
    graphed_s = wall_seconds(run)
    for state in states:
        for p in state.params:
            p.grad = None
    return None, (eager_s, graphed_s)


def _learn_gradient_buffers(states: list[LayerState], run) -> None:
    """One replayed forward and backward with every .grad None: the gradients autograd keeps
    are the graphs' buffers (where it copied one instead, the address is a freed copy's, which
    costs at most one needless copy later). The parameters' gradients are put back."""
    saved = [[p.grad for p in state.params] for state in states]
    for state in states:
        for p in state.params:
            p.grad = None
    run()
    for state, grads in zip(states, saved):
        state.static = {p.grad.data_ptr() for p in state.params if p.grad is not None}
        for p, g in zip(state.params, grads):
            p.grad = g


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:240] if text else "(no message)"


def _drop(picked: dict) -> None:
    for layer, _ in picked.values():
        _remove(layer, collect=False)
    gc.collect()


def _remove(layer: nn.Module, collect: bool = True) -> None:
    state = layer.__dict__.pop(MARK, None)
    layer.__dict__.pop("forward", None)
    if state is not None:
        _release([state], collect)


def _release(states: list[LayerState], collect: bool = True) -> None:
    for state in states:
        state.release()
    if collect:  # the graphed autograd Functions are classes: cycles by nature
        gc.collect()  # the replays' Function classes are cycles: freed here, with their graphs


__all__ = ["apply", "is_graphed", "layer_stacks"]
