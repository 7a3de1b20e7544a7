"""How fast eager PyTorch kernels of each memory family move their bytes, against the copy rate.

For each family of `tracing/families.py`, one training step (or forward) of a workload that is
mostly that family (probe/workloads.py: bf16, large enough to stream from memory) is traced by
gpushape on the meta device and timed on the GPU (a CUDA-graph replay: GPU time alone, what the
cost model prices). With the step's ops costed at the copy rate (efficiency 1),

    efficiency = (the family's ops' memory time) / (measured time - the other ops' time)

capped to [0.01, 1]. The profile keeps it under "memory_efficiency" and the cost model then
divides the family's memory time by it. Counting bytes with gpushape's own formulas keeps the
measurement and the prediction on one scale: the fraction absorbs whatever extra passes and
poor access patterns the eager kernels have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..bench.timer import cuda_graph, time_fn
from ..hardware import GPUSpec
from .workloads import WORKLOADS, FamilyWorkload

__all__ = ["WORKLOADS", "FamilyWorkload", "capped", "measure_family", "measure_memory_efficiency"]

_MIN_EFFICIENCY = 0.01


def _step(model: nn.Module, train: bool = True) -> Callable[[], Any]:
    params = list(model.parameters())

    def step() -> Any:
        out = model()
        return torch.autograd.grad(out, params, torch.ones_like(out))

    def forward() -> Any:
        with torch.no_grad():
            return model()

    return step if train else forward


def step_s(step: Callable[[], Any], device: str, repeats: int) -> float:
    """Median seconds of `step`: replayed from a CUDA graph on the GPU (GPU time alone, what
    the cost model prices), called directly on the CPU (a smoke test)."""
    if torch.device(device).type == "cuda":
        return time_fn(cuda_graph(step), warmup=3, repeats=repeats, device=device).median_s
    return time_fn(step, warmup=1, repeats=max(repeats // 4, 2), device=device).median_s


def capped(model_s: float, measured_s: float) -> float:
    """model_s / measured_s, rounded, within [0.01, 1] (0.01 where nothing was measured)."""
    ratio = model_s / measured_s if measured_s > 0 and model_s > 0 else _MIN_EFFICIENCY
    return round(min(max(ratio, _MIN_EFFICIENCY), 1.0), 4)


def measure_family(
    work: FamilyWorkload,
    spec: GPUSpec,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    scale: float = 1.0,
    repeats: int = 20,
) -> dict[str, Any]:
    """One family's efficiency (see the module docstring) and what it came from."""
    from ..tracing.cost import op_cost
    from ..tracing.families import memory_family
    from ..tracing.tracer import trace

    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    model = work.build(scale).to(dtype)
    family_s = other_s = 0.0
    if work.passes:
        big = next(iter(model.inputs))
        family_s = (
            work.passes * big.numel() * big.element_size() / flat.attainable_bandwidth_bytes_per_s()
        )
    else:
        for rec in trace(model, (), train=work.train).ops:
            c = op_cost(rec, flat)
            if memory_family(rec) == work.family.partition("@")[0]:  # "norm@768": norm
                family_s += c.memory_s
            else:
                other_s += c.kernel_time_s
    measured = step_s(_step(model.to(device), work.train), device, repeats)
    row = {
        "efficiency": capped(family_s, measured - other_s),
        "workload": work.describe,
        "dtype": str(dtype).removeprefix("torch."),
        "measured_s": measured,
        "family_roofline_s": family_s,
        "other_roofline_s": other_s,
    }
    if scale != 1.0:
        row["scale"] = scale  # the workload's leading dimension, scaled: a smoke test
    return row


def measure_memory_efficiency(
    spec: GPUSpec,
    *,
    device: str = "cuda",
    scale: float = 1.0,
    families: tuple[str, ...] | None = None,
    on_family: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """{family: measure_family(...)} for every workload (or those of `families`); a family whose
    workload fails gets {"error": ...} instead (and keeps the copy rate)."""
    out = {}
    for work in WORKLOADS:
        if families is not None and work.family not in families:
            continue
        if on_family is not None:
            on_family(work.family)
        try:
            measure = work.measure or measure_family
            out[work.family] = measure(work, spec, device=device, scale=scale)
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # one family, reported
            out[work.family] = {
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "workload": work.describe,
            }
    return out
