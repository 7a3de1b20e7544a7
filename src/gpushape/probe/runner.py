"""`gpushape probe`: measure this GPU's ceilings and shape cliffs, then check the guide on it.

Order of work: check that GEMMs and convolutions return the right numbers, measure the ceilings
(copy bandwidth, launch overhead eager and in a CUDA graph), run every sweep point of the plan
(each point budgeted from the datasheet beforehand, the estimate printed), analyse the curves
(`cliffs`), run the guide's claims (`guide_claims`) and build the profile (`profile`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
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

from ..hardware import GPUSpec
from ..hardware.profile import apply_profile
from . import attention as probe_attention
from . import convs as probe_convs
from . import guide_claims
from . import host as probe_host
from . import host_glue as probe_glue
from . import memory as probe_memory
from . import profile as probe_profile
from .measure import (
    MeasureConfig,
    copy_bytes_per_s,
    fp8_supported,
    graph_launch_overhead_s,
    launch_overhead_s,
)
from .plan import ProbePlan
from .tasks import Task, _run_task, build_tasks, check_kernels
from .workloads import optimizer as probe_optimizer

_CLAIM_EST_S = 0.6  # budget only: one claim's A/B measurement, autotuning included
_MEMORY_EST_S = 2.0  # budget only: one memory family's (or the stem's) traced, timed step
_ATTENTION_EST_S = 0.5  # budget only: one SDPA configuration, forward and fwd+bwd (H200: 0.4 s)


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
            "ceilings: copy, launch, host",
            total=1
            + len(tasks)
            + len(claims)
            + len(probe_memory.WORKLOADS)
            + 2
            + len(probe_attention.CONFIGS),
        )
        t0 = time.perf_counter()
        ceilings = _ceilings(plan, cfg)
        actual_s["ceilings"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        host = probe_host.measure_host(cfg.device, calls=plan.launch_kernels * 2)
        actual_s["host"] = time.perf_counter() - t0
        bar.update(job, description="host: module calls' Python, on real models")
        t0 = time.perf_counter()
        glue = probe_glue.measure_glue(cfg.device, _seconds(host), quick=plan.mode != "full")
        if glue:
            host["module_glue"] = glue
        actual_s["module_glue"] = time.perf_counter() - t0
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
        latency = probe_profile.fit_gemm_latency(sweeps, measured)
        measured = apply_profile(measured, {"gemm_latency": latency})
        memory = _memory_efficiency(plan, cfg, measured, bar, job)
        actual_s["memory_efficiency"] = sum(r["wall_s"] for r in memory.values())
        bar.update(job, description="optimizer steps: foreach and fused kernels")
        t0 = time.perf_counter()
        optimizer = {"rows": {}, "steps": [], "errors": {}}
        if plan.mode != "quick":  # eight profiled steps: more than the quick budget has room for
            optimizer = probe_optimizer.measure_optimizer_kernels(
                measured, device=cfg.device, scale=plan.memory_scale
            )
            sweeps["optimizer_kernels"] = optimizer["steps"]
        actual_s["optimizer_kernels"] = time.perf_counter() - t0
        bar.advance(job)
        bar.update(job, description="convolution on 3 input channels (stem)")
        t0 = time.perf_counter()
        stem = probe_convs.measure_small_cin_conv(
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
            kernels=plan.mode == "full",
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
        t0 = time.perf_counter()
        replay_gap = probe_memory.measure_graph_replay_gap(cfg.device)
        actual_s["graph_replay_gap"] = time.perf_counter() - t0
        t0 = time.perf_counter()  # last: its profiler session may slow later launches
        floor = probe_memory.measure_kernel_floor(cfg.device)
        actual_s["kernel_floor"] = time.perf_counter() - t0
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
        host=host,
        gemm_latency=latency,
        kernel_floor=floor,
        device_gap={"graph_replay": replay_gap} if replay_gap else None,
        optimizer_kernels={
            **optimizer["rows"],
            **({"errors": optimizer["errors"]} if optimizer["errors"] else {}),
        },
    )


def _memory_efficiency(
    plan: ProbePlan, cfg: MeasureConfig, spec: GPUSpec, bar: Progress, job: Any
) -> dict[str, dict[str, Any]]:
    """Eager kernels' bandwidth per memory family against `spec`'s (measured) copy rate."""
    out = {}
    for work in probe_memory.WORKLOADS:
        bar.update(job, description=f"memory efficiency: {work.family}")
        t0 = time.perf_counter()
        rows = probe_memory.measure_memory_efficiency(
            spec, device=cfg.device, scale=plan.memory_scale, families=(work.family,)
        )
        wall_s = round(time.perf_counter() - t0, 2)  # rows derived beside it: the same timing
        out.update({name: {**row, "wall_s": wall_s if name == work.family else 0.0}
                    for name, row in rows.items()})  # fmt: skip
        bar.advance(job)
    return out


def _seconds(rows: dict[str, Any]) -> dict[str, float]:
    return {k: v["seconds"] for k, v in rows.items() if isinstance(v, dict) and "seconds" in v}


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
