"""The probe's sweep points as tasks: each GEMM or convolution shape of the plan, budgeted from
the datasheet before it runs (`build_tasks`), timed (`_run_task`), and the check that this
GPU's GEMMs and convolutions return the right numbers before anything is timed
(`check_kernels`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import GpushapeError
from ..hardware import GPUSpec
from .measure import ConvShape, MeasureConfig, conv_s, gemm_flops, gemm_s
from .plan import ProbePlan

_LAUNCH_S = 5e-6  # a guess at per-call latency for the budget only; launch is measured anyway
_CONV_SETUP_S = 0.15  # cuDNN autotuning of a new shape, for the budget only
_GEMM_SETUP_S = 0.01
_MISALIGNED_SLOWDOWN = 4.0  # budget only: an unaligned GEMM runs at roughly a quarter speed


class ProbeError(GpushapeError, RuntimeError):
    """The device returned wrong numbers, so its timings would mean nothing."""


@dataclass(frozen=True)
class Task:
    """One sweep point: what it is (`row`), its FLOPs, how to time it, and its budget."""

    sweep: str
    row: dict[str, Any]
    flops: int
    run: Callable[[MeasureConfig], float]  # seconds per call
    est_s: float


def _estimate_s(call_s: float, cfg: MeasureConfig, setup_s: float) -> float:
    sample_s = min(max(cfg.target_s, call_s), cfg.max_inner * call_s)
    return setup_s + 5 * call_s + (1 + cfg.repeats) * sample_s  # first, sizing, warm-up, samples


def _gemm_rate(spec: GPUSpec, dtype: str) -> float:
    return spec.attainable_flops("fp32" if dtype == "fp32" else dtype, tensor_cores=dtype != "fp32")


def _gemm_task(
    task_sweep: str,
    m: int,
    n: int,
    k: int,
    dtype: str,
    layout: str,
    spec: GPUSpec,
    cfg: MeasureConfig,
    **extra: Any,
) -> Task:
    flops = gemm_flops(m, n, k)
    align = spec.tc_alignment("fp32" if dtype == "fp32" else dtype) or 1
    # sizes off the datasheet's alignment rule are budgeted at a quarter of the rate
    slowdown = 1 if all(d % align == 0 for d in (m, n, k)) else _MISALIGNED_SLOWDOWN
    call_s = slowdown * flops / _gemm_rate(spec, dtype) + _LAUNCH_S
    row = {
        "dtype": dtype,
        "layout": "nt" if dtype == "fp8" else layout,
        "m": m,
        "n": n,
        "k": k,
        **extra,
    }
    return Task(
        task_sweep,
        row,
        flops,
        lambda c: gemm_s(m, n, k, dtype, c, layout=row["layout"]),
        _estimate_s(call_s, cfg, _GEMM_SETUP_S),
    )


def _conv_task(
    task_sweep: str, shape: ConvShape, dtype: str, spec: GPUSpec, cfg: MeasureConfig, **extra: Any
) -> Task:
    # convolutions reach about half a GEMM's rate; bytes: input + output, bf16
    out_elems = shape.batch * shape.cout * shape.hw * shape.hw // shape.stride**2
    bytes_moved = 2 * (shape.batch * shape.cin * shape.hw**2 + out_elems)
    call_s = (
        max(
            shape.flops / (0.5 * spec.attainable_flops(dtype)),
            bytes_moved / spec.attainable_bandwidth_bytes_per_s(),
        )
        + _LAUNCH_S
    )
    row = {"dtype": dtype, **dataclasses.asdict(shape), **extra}
    return Task(
        task_sweep,
        row,
        shape.flops,
        lambda c: conv_s(shape, dtype, c),
        _estimate_s(call_s, cfg, _CONV_SETUP_S),
    )


def _align_tasks(plan: ProbePlan, spec: GPUSpec, fp8: bool) -> list[Task]:
    cfg, tasks = plan.measure, []
    layouts = [(d, "nn") for d in plan.align_dtypes if d != "fp8" or fp8]
    layouts += [(d, "nt") for d in plan.linear_dtypes]
    for dtype, layout in layouts:
        for base in plan.align_bases:
            other = plan.gemm_other(base)
            for dim in plan.align_dims:
                for size in (base + o for o in plan.align_offsets):
                    mnk = {d.lower(): size if d == dim else other for d in ("M", "N", "K")}
                    tasks.append(
                        _gemm_task(
                            "gemm_align",
                            **mnk,
                            dtype=dtype,
                            layout=layout,
                            spec=spec,
                            cfg=cfg,
                            dim=dim,
                            base=base,
                            size=size,
                        )
                    )
    return tasks


def _conv_channel_tasks(plan: ProbePlan, spec: GPUSpec) -> list[Task]:
    tasks = []
    for dtype in plan.conv_dtypes:
        for sweep in plan.conv_sweeps:
            for size in (sweep.base + o for o in plan.conv_offsets):
                cin, cout = (size, sweep.fixed) if sweep.vary == "cin" else (sweep.fixed, size)
                shape = ConvShape(
                    batch=plan.conv_batch, cin=cin, cout=cout, hw=plan.conv_hw, kernel=sweep.kernel
                )
                tasks.append(
                    _conv_task(
                        "conv_channels",
                        shape,
                        dtype,
                        spec,
                        plan.measure,
                        sweep=sweep.name,
                        dim=sweep.vary,
                        base=sweep.base,
                        size=size,
                    )
                )
    return tasks


def _batch_tasks(plan: ProbePlan, spec: GPUSpec) -> list[Task]:
    cfg, nk, c = plan.measure, plan.gemm_batch_nk, plan.conv_batch_channels
    tasks = [
        _gemm_task("gemm_batch", m, nk, nk, "bf16", "nt", spec, cfg, dim="batch", size=m)
        for m in plan.batch_sizes(plan.gemm_batch_context)
    ]
    for batch in plan.batch_sizes(plan.conv_batch_context):
        shape = ConvShape(batch=batch, cin=c, cout=c, hw=plan.conv_hw, kernel=3)
        tasks.append(_conv_task("conv_batch", shape, "bf16", spec, cfg, dim="batch", size=batch))
    return tasks


def build_tasks(plan: ProbePlan, spec: GPUSpec, *, fp8: bool) -> list[Task]:
    """Every sweep point of the plan, in the order they run."""
    cfg = plan.measure
    peaks = [
        _gemm_task("gemm_peak", s, s, s, d, "nn", spec, cfg, size=s)
        for d in plan.peak_dtypes
        if d != "fp8" or fp8
        for s in plan.peak_sizes
    ]
    wave = [
        _gemm_task("wave", m, plan.wave_nk, plan.wave_nk, "bf16", "nn", spec, cfg, size=m)
        for m in plan.wave_ms()
    ]
    return (
        peaks
        + _align_tasks(plan, spec, fp8)
        + _conv_channel_tasks(plan, spec)
        + _batch_tasks(plan, spec)
        + wave
    )


# ---- running -----------------------------------------------------------------------------------
def _run_task(task: Task, cfg: MeasureConfig) -> dict[str, Any]:
    try:
        seconds = task.run(cfg)
    except (RuntimeError, ValueError) as exc:  # fp8 refuses unaligned sizes; OOM; no kernel
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return {**task.row, "time_s": None, "flops_per_s": None, "error": message}
    return {**task.row, "time_s": seconds, "flops_per_s": task.flops / seconds}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max())


def check_kernels(device: str, *, fp8: bool) -> None:
    """GEMM, convolution (and fp8 GEMM) give the right numbers here, before anything is timed."""
    a, b = torch.randn(256, 128, device=device), torch.randn(128, 192, device=device)
    ref = a.double() @ b.double()
    errors = {d: _rel_err(a.to(d) @ b.to(d), ref) for d in (torch.float16, torch.bfloat16)}
    x, w = torch.randn(2, 16, 12, 12, device=device), torch.randn(8, 16, 3, 3, device=device)
    conv_ref = F.conv2d(x.double(), w.double(), padding=1)
    xl = x.bfloat16().to(memory_format=torch.channels_last)
    errors["conv bf16"] = _rel_err(F.conv2d(xl, w.bfloat16(), padding=1), conv_ref)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        out = torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16)
        errors["fp8"] = _rel_err(out, a8.float().double() @ b8.t().float().double())
    bad = {k: v for k, v in errors.items() if not v < 3e-2}
    if bad:
        raise ProbeError(
            f"wrong results on {device}, relative error {bad}: timings would mean "
            "nothing; check the driver and PyTorch build"
        )
