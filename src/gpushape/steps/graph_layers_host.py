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

with `graph_layer` and `graph_layer_param` the profile's host rates (probe/host.py). None
where the profile lacks them: the stage is then priced as before.
"""

from __future__ import annotations

from typing import Any

from torch import nn

RATES = ("graph_layer", "graph_layer_param")


def _inside(module: str, captured: list[str]) -> bool:
    return any(module == c or module.startswith(c + ".") for c in captured)


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

    records = [r for r in trace.ops if r.module and _inside(r.module, captured)]
    modules = {
        ".".join(parts[:i])
        for r in trace.ops
        if r.phase == "forward" and r.module and _inside(r.module, captured)
        for parts in [r.module.split(".")]
        for i in range(1, len(parts) + 1)
    }
    modules = {m for m in modules if _inside(m, captured)}
    return ops_seconds(records, rates) + len(modules) * module_rate(rates)


def graph_layers_host_s(
    model: nn.Module, inputs: Any, gpu: Any, captured: list[str], eager_host_s: float
) -> float | None:
    """The stage's host seconds (module docstring), from the eager audit's `eager_host_s`;
    None where the profile has no graph-layer rates or no layer was captured."""
    from ..models.labels import with_labels
    from ..tracing.tracer import trace

    per_layer = rates_of(gpu)
    host = getattr(gpu.achievable, "host", None) or {}
    if per_layer is None or not captured or not all(k in host for k in ("op", "view")):
        return None
    traced = trace(model, with_labels(model, inputs), train=True)
    params = 0
    for name in captured:
        try:
            params += sum(1 for _ in model.get_submodule(name).parameters())
        except AttributeError:
            continue
    replay = len(captured) * per_layer[0] + params * per_layer[1]
    return max(eager_host_s - layers_dispatch_s(traced, host, captured), 0.0) + replay
