"""`gpushape probe`: measure this GPU's ceilings and shape cliffs, then check the guide on it.

Order of work: check that GEMMs and convolutions return the right numbers, measure the ceilings
(copy bandwidth, launch overhead eager and in a CUDA graph), run every sweep point of the plan
(each point budgeted from the datasheet beforehand, the estimate printed), analyse the curves
(`cliffs`), run the guide's claims (`guide_claims`) and build the profile (`profile`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ..errors import GpushapeError
from ..hardware import GPUSpec
from ..hardware.profile import apply_profile
from . import attention as probe_attention
from . import guide_claims
from . import memory as probe_memory
from . import profile as probe_profile
from . import stem as probe_stem
from .measure import (
    ConvShape,
    MeasureConfig,
    conv_s,
    copy_bytes_per_s,
    fp8_supported,
    gemm_flops,
    gemm_s,
    graph_launch_overhead_s,
    launch_overhead_s,
)
from .plan import ProbePlan

_LAUNCH_S = 5e-6  # a guess at per-call latency for the budget only; launch is measured anyway
_CONV_SETUP_S = 0.15  # cuDNN autotuning of a new shape, for the budget only
_GEMM_SETUP_S = 0.01
_MISALIGNED_SLOWDOWN = 4.0  # budget only: an unaligned GEMM runs at roughly a quarter speed
_CLAIM_EST_S = 0.6  # budget only: one claim's A/B measurement, autotuning included
_MEMORY_EST_S = 2.0  # budget only: one memory family's (or the stem's) traced, timed step
_ATTENTION_EST_S = 0.5  # budget only: one SDPA configuration, forward and fwd+bwd (H200: 0.4 s)


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


def _ceilings(plan: ProbePlan, cfg: MeasureConfig) -> dict[str, float | None]:
    cuda = torch.device(cfg.device).type == "cuda"
    return {
        "copy_bytes_per_s": copy_bytes_per_s(plan.copy_bytes, cfg),
        "launch_overhead_s": launch_overhead_s(cfg, plan.launch_kernels),
        "graph_launch_overhead_s": (
            graph_launch_overhead_s(cfg, plan.launch_kernels) if cuda else None
        ),
    }


def _budget_table(tasks: list[Task], plan: ProbePlan, claims: int) -> Table:
    table = Table(
        title=f"gpushape probe ({plan.mode}): budget from datasheet rates (points x time per point)"
    )
    for col in ("sweep", "points", "estimate s"):
        table.add_column(col, justify="left" if col == "sweep" else "right")
    for sweep, est in _by_sweep(tasks).items():
        table.add_row(sweep, str(est[0]), f"{est[1]:.1f}")
    table.add_row("guide claims (A/B measurements)", str(claims), f"{claims * _CLAIM_EST_S:.1f}")
    families = len(probe_memory.WORKLOADS) + 1  # and the stem convolution
    table.add_row(
        "eager kernels by memory family, stem conv",
        str(families),
        f"{families * _MEMORY_EST_S:.1f}",
    )
    attention = len(probe_attention.CONFIGS)
    table.add_row(
        "fused attention (SDPA backends, head sizes)",
        str(attention),
        f"{attention * _ATTENTION_EST_S:.1f}",
    )
    total_s = (
        sum(t.est_s for t in tasks)
        + claims * _CLAIM_EST_S
        + families * _MEMORY_EST_S
        + attention * _ATTENTION_EST_S
    )
    table.add_row("total", str(len(tasks) + claims + families + attention), f"{total_s:.1f}")
    return table


def _by_sweep(tasks: list[Task]) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for t in tasks:
        n, s = out.get(t.sweep, (0, 0.0))
        out[t.sweep] = (n + 1, s + t.est_s)
    return out


def _progress(console: Console, show: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
    )


def run_probe(
    plan: ProbePlan, *, spec: GPUSpec, console: Console | None = None, show_progress: bool = True
) -> dict[str, Any]:
    """Measure everything in `plan` on `plan.measure.device`; returns the profile (a dict)."""
    console = console or Console(stderr=True)
    started = time.perf_counter()
    cfg = dataclasses.replace(
        plan.measure,
        l2_bytes=spec.l2_bytes if torch.device(plan.measure.device).type == "cuda" else 0,
    )
    torch.manual_seed(0)
    fp8 = fp8_supported(cfg.device)
    check_kernels(cfg.device, fp8=fp8)
    tasks = build_tasks(dataclasses.replace(plan, measure=cfg), spec, fp8=fp8)
    claims = guide_claims.selected(plan)
    if show_progress:
        console.print(_budget_table(tasks, plan, len(claims)))
    sweeps: dict[str, list[dict[str, Any]]] = {}
    actual_s: dict[str, float] = {}
    with _progress(console, show_progress) as bar:
        job = bar.add_task(
            "ceilings: copy, launch",
            total=1
            + len(tasks)
            + len(claims)
            + len(probe_memory.WORKLOADS)
            + 1
            + len(probe_attention.CONFIGS),
        )
        t0 = time.perf_counter()
        ceilings = _ceilings(plan, cfg)
        actual_s["ceilings"] = time.perf_counter() - t0
        bar.advance(job)
        for task in tasks:
            bar.update(job, description=f"{task.sweep} {_describe(task.row)}")
            t0 = time.perf_counter()
            sweeps.setdefault(task.sweep, []).append(_run_task(task, cfg))
            actual_s[task.sweep] = actual_s.get(task.sweep, 0.0) + time.perf_counter() - t0
            bar.advance(job)
        analysis = probe_profile.analyze(sweeps, spec)
        # the rates below are fractions of the copy and GEMM rates just measured
        measured = apply_profile(
            spec,
            {
                "ceilings": {
                    "copy_bytes_per_s": ceilings["copy_bytes_per_s"],
                    "gemm_flops": probe_profile.tensor_core_peaks(analysis),
                }
            },
        )
        memory = _memory_efficiency(plan, cfg, measured, bar, job)
        actual_s["memory_efficiency"] = sum(r["wall_s"] for r in memory.values())
        bar.update(job, description="convolution on 3 input channels (stem)")
        t0 = time.perf_counter()
        stem = probe_stem.measure_small_cin_conv(
            measured, device=cfg.device, batch=plan.stem_shape[0], size=plan.stem_shape[1]
        )
        actual_s["conv_small_cin"] = time.perf_counter() - t0
        bar.advance(job)
        t0 = time.perf_counter()
        attention = probe_attention.measure_attention(
            measured,
            device=cfg.device,
            shape=plan.attention_shape,
            on_config=lambda c: _on_attention(bar, job, c),
        )
        actual_s["attention"] = time.perf_counter() - t0
        context = guide_claims.ClaimContext(
            cfg=cfg, mode=plan.mode, spec=spec, ceilings=ceilings, sweeps=sweeps, analysis=analysis
        )
        t0 = time.perf_counter()
        results = guide_claims.run_claims(
            claims, context, on_claim=lambda c: _on_claim(bar, job, c)
        )
        actual_s["guide_claims"] = time.perf_counter() - t0
    timing = {
        "estimate_s": {k: round(v[1], 2) for k, v in _by_sweep(tasks).items()},
        "actual_s": {k: round(v, 2) for k, v in actual_s.items()},
        "total_s": round(time.perf_counter() - started, 2),
    }
    return probe_profile.build_profile(
        plan=plan,
        spec=spec,
        cfg=cfg,
        ceilings=ceilings,
        sweeps=sweeps,
        analysis=analysis,
        claims=results,
        timing=timing,
        memory=memory,
        stem=stem,
        attention=attention,
    )


def _memory_efficiency(
    plan: ProbePlan, cfg: MeasureConfig, spec: GPUSpec, bar: Progress, job: Any
) -> dict[str, dict[str, Any]]:
    """Eager kernels' bandwidth per memory family against `spec`'s (measured) copy rate."""
    out = {}
    for work in probe_memory.WORKLOADS:
        bar.update(job, description=f"memory efficiency: {work.family}")
        t0 = time.perf_counter()
        row = probe_memory.measure_memory_efficiency(
            spec, device=cfg.device, scale=plan.memory_scale, families=(work.family,)
        )
        out[work.family] = {**row[work.family], "wall_s": round(time.perf_counter() - t0, 2)}
        bar.advance(job)
    return out


def _on_attention(bar: Progress, job: Any, cfg: probe_attention.AttentionConfig) -> None:
    bar.update(job, description=cfg.describe)
    bar.advance(job)


def _on_claim(bar: Progress, job: Any, claim_id: str) -> None:
    bar.update(job, description=f"guide claim {claim_id}")
    bar.advance(job)


def _describe(row: dict[str, Any]) -> str:
    if "m" in row:
        return f"{row['dtype']} {row['m']}x{row['n']}x{row['k']}"
    k = row["kernel"]
    return f"{row['dtype']} b{row['batch']} {row['cin']}->{row['cout']} {k}x{k}"
