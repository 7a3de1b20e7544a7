"""The host's side of an eager step whose repeated layers graph-layers replays from CUDA graphs.

The loop (`fix_by_fix`) priced such a stage as the audit's graph mode, as if the whole step
were one graph: no host left. The host does less, not nothing. It still dispatches everything
outside the captured layers (the stem, the head, the loss, the optimizer), and each captured
layer's call costs two graph launches, the copies into the graphs' static inputs and the
autograd function around them. On a lent H100 a MobileNetV3 step so graphed (14 blocks) took
13.0 ms to issue against 8 ms of GPU work once its BatchNorms were fused and it ran
channels_last: host-bound, where graph mode had priced it GPU-bound, so the loop predicted
channels-last at twice its measured saving and CUDA graphs of the whole step, which saved
3.7 ms, at nothing (benchmarks/results/loops-h100-17).

    host = the eager step's host - the captured layers' dispatch (their ops, views and
           module calls, as tracing/host.py prices them) + per captured layer
           (graph_layer + graph_layer_param x its parameter tensors)

with `graph_layer` and `graph_layer_param` the profile's host rates (probe/host.py); the
GPU's idle time between the captured layers' kernels that of a graph's, and the GPU's work plus
the replays' copies into the graphs (`graph_layers_step`: each byte read and written at the
copy rate; a layer reading the previous layer's output in place copies nothing, so a chain of
layers copies its first input and its last output's gradient; before the links, ResNet-50-GN's
16 bottlenecks copied 0.85 ms a step on an H100, which the loop had priced at nothing), and the
GPU's wait at each replay's boundary (`replays_idle_s`: the profile's "graph_replay" gap,
probe/memory.py, two a captured layer; a whole-step graph has none of them, so without it the
loop under-predicted that graph's saving after graph-layers: 0.05 against 0.21 ms measured on
ResNet-50-GN, benchmarks/results/loops-h100-30).
None where the profile lacks the rates: the stage is then priced as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .graph_layers_gemv import gemv_saving_s, inside

RATES = ("graph_layer", "graph_layer_param")


def rates_of(gpu: Any) -> tuple[float, float] | None:
    """(seconds a graphed layer, seconds a parameter tensor of it), or None. A profile keeps
    no rate of 0 (hardware/profile.py), so a missing per-parameter rate is none."""
    host = getattr(getattr(gpu, "achievable", None), "host", None) or {}
    if RATES[0] not in host:
        return None
    return float(host[RATES[0]]), float(host.get(RATES[1], 0.0))


def layers_dispatch_s(trace: Any, rates: Any, captured: list[str]) -> float:
    """What dispatching the captured layers' ops, views and module calls costs the host in the
    eager step (`tracing/host.py`'s rates)."""
    from ..tracing.host import module_rate, ops_seconds

    records = [r for r in trace.ops if r.module and inside(r.module, captured)]
    modules = {
        ".".join(parts[:i])
        for r in trace.ops
        if r.phase == "forward" and r.module and inside(r.module, captured)
        for parts in [r.module.split(".")]
        for i in range(1, len(parts) + 1)
    }
    modules = {m for m in modules if inside(m, captured)}
    return ops_seconds(records, rates) + len(modules) * module_rate(rates)


def graph_layers_host_s(
    model: nn.Module, inputs: Any, gpu: Any, captured: list[str], eager_host_s: float
) -> float | None:
    """The stage's host seconds (module docstring), from the eager audit's `eager_host_s`;
    None where the profile has no graph-layer rates or no layer was captured."""
    if not _priced(gpu, captured):
        return None
    return _host_s(_trace(model, inputs), model, gpu, captured, eager_host_s)


def graph_layers_step(
    model: nn.Module, inputs: Any, gpu: Any, captured: list[str], eager_step: Any
) -> Any | None:
    """The eager audit's step (`auditing.modes.StepTime`) as graph-layers runs it: its host
    `graph_layers_host_s`, the captured layers' kernels idling between each other as a
    CUDA graph's do (the profile's device gap for "graph" in place of "eager"; on an H100
    1.30 against 0.25 us a kernel: MobileNetV3's 14 graphed blocks saved 0.64 ms a step where
    the GPU set the pace, `benchmarks/results/loops-h100-18`), and their Linears' bias
    gradients by a GEMV (`graph_layers_gemv.py`). None as graph_layers_host_s."""
    from ..auditing.modes import device_gap_s
    from ..tracing.cost import cost

    if not _priced(gpu, captured):
        return None
    traced = _trace(model, inputs)
    host_s = _host_s(traced, model, gpu, captured, eager_step.host_s)
    costed = cost(traced, gpu)
    kernels = sum(
        costed.ops[r.index].kernels
        for r in traced.ops
        if r.kind == "compute" and r.module and inside(r.module, captured)
    )
    saved = kernels * max(device_gap_s(gpu, "eager") - device_gap_s(gpu, "graph"), 0.0)
    idle_s = max(eager_step.idle_s - saved, 0.0) + replays_idle_s(gpu, captured)
    gpu_s = max(eager_step.gpu_s - gemv_saving_s(traced, costed, gpu, captured), 0.0)
    gpu_s += copies_s(model, gpu, captured)
    return dataclasses.replace(eager_step, host_s=host_s, idle_s=idle_s, gpu_s=gpu_s)


def replays_idle_s(gpu: Any, captured: list[str]) -> float:
    """The GPU's idle time a step at the captured layers' graph boundaries: two replays a
    layer (its forward's graph and its backward's), each the profile's `device_gap`
    "graph_replay" (probe/memory.py; 0 where the profile has not measured it)."""
    from ..auditing.modes import device_gap_s

    return 2 * len(captured) * device_gap_s(gpu, "graph_replay")


def copies_s(model: nn.Module, gpu: Any, captured: list[str]) -> float:
    """GPU seconds a step of the captured layers' copies into their graphs (the bytes each
    layer's capture recorded, `LayerState.copied`, read and written at the copy rate)."""
    from ..transforms._graph_replay import MARK

    total = 0
    for name in captured:
        try:
            state = model.get_submodule(name).__dict__.get(MARK)
        except AttributeError:
            continue
        total += int(getattr(state, "copied", 0) or 0)
    return 2 * total / gpu.attainable_bandwidth_bytes_per_s() if total else 0.0


def _priced(gpu: Any, captured: list[str]) -> bool:
    host = getattr(getattr(gpu, "achievable", None), "host", None) or {}
    return rates_of(gpu) is not None and bool(captured) and all(k in host for k in ("op", "view"))


def _trace(model: nn.Module, inputs: Any) -> Any:
    from ..models.labels import with_labels
    from ..tracing.tracer import trace

    return trace(model, with_labels(model, inputs), train=True)


def _host_s(traced: Any, model: nn.Module, gpu: Any, captured: list[str], eager_s: float) -> float:
    per_layer, param = rates_of(gpu)
    params = 0
    for name in captured:
        try:
            params += sum(1 for _ in model.get_submodule(name).parameters())
        except AttributeError:
            continue
    replay = len(captured) * per_layer + params * param
    return max(eager_s - layers_dispatch_s(traced, gpu.achievable.host, captured), 0.0) + replay


def stage_step(variant: Any, gpu: Any, rules: Any) -> tuple[Any, Any] | None:
    """(the stage's eager audit, its step with graph-layers' host) where the profile prices
    graph-layers' replays and the stage says which layers it captured; else None."""
    from ..auditing.api import audit
    from .loop_predict import model_dtype as _dtype

    spec = _spec(gpu)
    captured = captured_layers(variant)
    if rates_of(spec) is None or not captured:
        return None
    step = variant.step
    eager = audit(step.model, step.batch.inputs, gpu, dtype=_dtype(step.model), train=True,
                  mode="eager", optimizer=step.optimizer, rules=rules)  # fmt: skip
    if eager.step is None:
        return None
    graphed = graph_layers_step(step.model, step.batch.inputs, spec, captured, eager.step)
    return None if graphed is None else (eager, graphed)


def captured_layers(variant: Any) -> list[str]:
    """The layers graph-layers captured in a built stage (its optimize report's changes)."""
    from .loop_plan import GRAPH_LAYERS

    report = getattr(variant, "optimize_report", None)
    return [c.module for c in getattr(report, "applied", ()) if c.transform == GRAPH_LAYERS]


def whole_graph_step(variant: Any, gpu: Any, step: Any) -> Any:
    """A stage with graph-layers' layers priced in graph mode (a profile without graph-layer
    rates, or the whole step one CUDA graph captured around them): the graph mode's `step` less
    the GEMV bias gradients those layers take (transforms/_graph_replay.py,
    graph_layers_gemv.py); `step` as it is without captured layers."""
    from ..tracing.cost import cost

    captured = captured_layers(variant)
    if not captured:
        return step
    spec = _spec(gpu)
    traced = _trace(variant.step.model, variant.step.batch.inputs)
    saving = gemv_saving_s(traced, cost(traced, spec), spec, captured)
    return dataclasses.replace(step, gpu_s=max(step.gpu_s - saving, 0.0))


def fused_step(graphed: Any, optimizer: Any, gpu_saving_s: float, gpu: Any) -> Any:
    """A graph-layers stage's step (`stage_step`) with its optimizer fused: the GPU's work less
    the fused step's saving, the host's less what the foreach step's Python cost it
    (tracing/optimizer_step.py) at `gpu`'s rates. Not the eager finding's wall saving,
    which counts the eager step's host: on the graphed step the two can differ in sign."""
    from ..tracing.optimizer_step import foreach_host_s

    host = foreach_host_s(optimizer, _spec(gpu).achievable.host or {})
    return dataclasses.replace(
        graphed,
        gpu_s=max(graphed.gpu_s - gpu_saving_s, 0.0),
        host_s=max(graphed.host_s - host, 0.0),
    )


def _spec(gpu: Any) -> Any:
    """A GPUSpec, or what `audit` takes for one, as a GPUSpec."""
    from ..auditing.target import resolve_target

    return gpu if hasattr(gpu, "achievable") else resolve_target(gpu).spec
