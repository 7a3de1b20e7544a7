"""From sweep rows to a calibrated profile: curves, cliffs, ceilings, and the JSON on disk.

The profile is the format `hardware.profile` reads (see its docstring); this module adds the
evidence behind every number: the cliffs per dtype and dimension, the wave-quantization fit, the
guide's claims with verdicts, how the probe ran, and the raw sweep rows.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
import shlex
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..hardware import GPUSpec
from ..hardware.profile import PROFILE_FORMAT, PROFILE_VERSION
from .cliffs import Curve, find_granularity, fit_wave_pattern
from .measure import MeasureConfig

Rows = list[dict[str, Any]]
# Peak dtypes that run on tensor cores go to ceilings.gemm_flops; fp32 with TF32 off runs on
# CUDA cores and goes to ceilings.gemm_flops_cuda_cores (hardware.profile divides gemm_flops by
# the tensor-core peak, so an fp32 figure there would read as a tiny TF32 fraction).
_CUDA_CORE_DTYPES = ("fp32",)


def curves_by(rows: Rows, group: Mapping[str, Any], split: str) -> list[Curve]:
    """Curves (size -> flops_per_s) of the rows matching `group`, one per value of `split`."""
    picked = [r for r in rows if all(r.get(k) == v for k, v in group.items())]
    curves = []
    for key in sorted({r.get(split) for r in picked}, key=str):
        points = sorted((r["size"], r.get("flops_per_s")) for r in picked if r.get(split) == key)
        curves.append(
            Curve(tuple(s for s, _ in points), tuple(t for _, t in points), label=f"{split} {key}")
        )
    return curves


def gemm_curves(sweeps: Mapping[str, Rows], dtype: str, layout: str, dim: str) -> list[Curve]:
    return curves_by(
        sweeps.get("gemm_align", []), {"dtype": dtype, "layout": layout, "dim": dim}, "base"
    )


def conv_curves(sweeps: Mapping[str, Rows], dtype: str, sweep: str) -> list[Curve]:
    return curves_by(sweeps.get("conv_channels", []), {"dtype": dtype, "sweep": sweep}, "base")


def _window_curves(rows: Rows, width: int = 8) -> list[Curve]:
    """Batch sizes near a multiple of 128 (the sweep's windows); context points left out,
    since small batches are slow for reasons other than alignment."""
    centres = sorted({round(r["size"] / 128) * 128 for r in rows} - {0})
    curves = []
    for c in centres:
        near = sorted(
            (r["size"], r.get("flops_per_s")) for r in rows if abs(r["size"] - c) <= width
        )
        if len(near) >= 5:
            curves.append(
                Curve(tuple(s for s, _ in near), tuple(t for _, t in near), label=f"window {c}")
            )
    return curves


def _gemm_cliffs(rows: Rows) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for layout, dtype, dim in sorted({(r["layout"], r["dtype"], r["dim"]) for r in rows}):
        curves = gemm_curves({"gemm_align": rows}, dtype, layout, dim)
        out.setdefault(layout, {}).setdefault(dtype, {})[dim] = find_granularity(curves).to_dict()
    return out


def _conv_cliffs(rows: Rows) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for dtype, sweep in sorted({(r["dtype"], r["sweep"]) for r in rows}):
        curves = conv_curves({"conv_channels": rows}, dtype, sweep)
        out.setdefault(dtype, {})[sweep] = find_granularity(curves).to_dict()
    return out


def _wave(rows: Rows, spec: GPUSpec) -> dict[str, Any]:
    points = sorted((r["m"], r["flops_per_s"]) for r in rows if r.get("flops_per_s"))
    if not points:
        return {"error": "no wave sweep points ran"}
    n = rows[0]["n"]
    try:
        fit = fit_wave_pattern([m for m, _ in points], n, [t for _, t in points], spec.sm_count)
    except ValueError as exc:
        return {"error": str(exc)}
    return {
        "sm_count": spec.sm_count,
        "n": n,
        "k": rows[0]["k"],
        "dtype": rows[0]["dtype"],
        "sizes": [m for m, _ in points],
        **fit.to_dict(),
    }


def _peaks(rows: Rows) -> dict[str, float]:
    best: dict[str, float] = {}
    for r in rows:
        if r.get("flops_per_s"):
            best[r["dtype"]] = max(best.get(r["dtype"], 0.0), r["flops_per_s"])
    return best


def analyze(sweeps: Mapping[str, Rows], spec: GPUSpec) -> dict[str, Any]:
    """Cliffs per dtype and dimension, batch windows, wave fit, peaks and tc alignment."""
    gemm = _gemm_cliffs(sweeps.get("gemm_align", []))
    align: dict[str, int] = {}
    for by_dtype in gemm.values():  # every layout: a dimension must suit all of them
        for dtype, by_dim in by_dtype.items():
            for cliff in by_dim.values():
                align[dtype] = max(align.get(dtype, 1), cliff["granularity"])
    batch = {}
    for name in ("gemm_batch", "conv_batch"):
        curves = _window_curves(sweeps.get(name, []))
        if curves:
            batch[name] = find_granularity(curves).to_dict()
    return {
        "gemm": gemm,
        "conv": _conv_cliffs(sweeps.get("conv_channels", [])),
        "batch": batch,
        "wave": _wave(sweeps["wave"], spec) if sweeps.get("wave") else {},
        "gemm_peak": _peaks(sweeps.get("gemm_peak", [])),
        "tc_align_elems": align,
    }


def _software() -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "python": platform.python_version(),
    }


def _device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or "cpu"


LATENCY_SWEEPS = ("wave", "gemm_batch", "gemm_align")
LATENCY_MOST_S = 100e-6  # the GEMMs the latency is fitted on: those under this time
LATENCY_GRID_S = tuple(round(i * 0.25, 2) * 1e-6 for i in range(41))  # 0 to 10 us
# the full probe's sweeps hold 41 such points on an H100 or H200 and fitted 3.25-4.25 us; the
# quick probe's 29 gave 1.0-7.0 us on one chip, too few to fit (the default stays)
_LATENCY_MIN_POINTS = 36


def fit_gemm_latency(sweeps: Mapping[str, Rows], spec: GPUSpec) -> dict[str, Any]:
    """The GEMM kernel latency (`Achievable.gemm_latency_s`) that best explains the bf16 GEMM
    sweeps' small products: each aligned point under LATENCY_MOST_S is priced as the cost model
    prices it on `spec` (its measured peaks: max(FLOPs at the shape's rate + latency, bytes at
    the copy rate)), and the latency on a 0.25 us grid with the least median |log(predicted /
    measured)| is kept. {} when the sweeps hold too few such points (the quick probe's, a
    CPU smoke test's)."""
    from ..tracing.flops.registry import Gemm
    from ..tracing.gemm_model import gemm_efficiency

    rate = spec.attainable_flops("bf16")
    bandwidth = spec.attainable_bandwidth_bytes_per_s() * spec.achievable.memory("gemm")
    points = []
    for name in LATENCY_SWEEPS:
        for r in sweeps.get(name, []):
            m, n, k, t = r.get("m"), r.get("n"), r.get("k"), r.get("time_s")
            if r.get("dtype") != "bf16" or not (m and n and k and t) or t >= LATENCY_MOST_S:
                continue
            if any(d % spec.tc_alignment("bf16") for d in (n, k)):
                continue
            eff = gemm_efficiency(Gemm(m=m, n=n, k=k, flops=2 * m * n * k), spec, "bf16")
            compute_s = 2 * m * n * k / (rate * eff.efficiency)
            points.append((compute_s, 2 * (m * k + k * n + m * n) / bandwidth, t))
    if len(points) < _LATENCY_MIN_POINTS:
        return {}

    def error(latency: float) -> float:
        return statistics.median(abs(math.log(max(c + latency, b) / t)) for c, b, t in points)

    best = min(LATENCY_GRID_S, key=error)
    return {
        "seconds": best,
        "points": len(points),
        "median_abs_log_error": {"without": round(error(0.0), 4), "with": round(error(best), 4)},
        "workload": f"bf16 GEMMs of the {', '.join(LATENCY_SWEEPS)} sweeps under "
        f"{LATENCY_MOST_S * 1e6:.0f} us, aligned N and K",
    }


def tensor_core_peaks(analysis: Mapping[str, Any]) -> dict[str, float]:
    """The large-GEMM peaks of the dtypes that run on tensor cores, by dtype key."""
    return {d: f for d, f in analysis["gemm_peak"].items() if d not in _CUDA_CORE_DTYPES}


def build_profile(
    *,
    plan: Any,
    spec: GPUSpec,
    cfg: MeasureConfig,
    ceilings: Mapping[str, float | None],
    sweeps: Mapping[str, Rows],
    analysis: Mapping[str, Any],
    claims: list[dict[str, Any]],
    timing: Mapping[str, Any],
    memory: Mapping[str, Any] | None = None,
    stem: Mapping[str, Any] | None = None,
    attention: Mapping[str, Any] | None = None,
    host: Mapping[str, Any] | None = None,
    gemm_latency: Mapping[str, Any] | None = None,
    kernel_floor: Mapping[str, Any] | None = None,
    optimizer_kernels: Mapping[str, Any] | None = None,
    device_gap: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    peaks = analysis["gemm_peak"]
    ceiling_out: dict[str, Any] = {
        "copy_bytes_per_s": ceilings["copy_bytes_per_s"],
        "gemm_flops": tensor_core_peaks(analysis),
        "gemm_flops_cuda_cores": {d: f for d, f in peaks.items() if d in _CUDA_CORE_DTYPES},
        "gemm_peak_sizes": list(plan.peak_sizes),
        "launch_overhead_s": ceilings["launch_overhead_s"],
    }
    if ceilings.get("graph_launch_overhead_s") is not None:
        ceiling_out["graph_launch_overhead_s"] = ceilings["graph_launch_overhead_s"]
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "gpu": spec.name,
        "device_name": _device_name(cfg.device),
        "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "software": _software(),
        "device": {
            "sm_count": spec.sm_count,
            "memory_bytes": spec.memory_bytes,
            "l2_bytes": spec.l2_bytes,
        },
        "ceilings": ceiling_out,
        "tc_align_elems": dict(analysis["tc_align_elems"]),
        "cliffs": {"gemm": analysis["gemm"], "conv": analysis["conv"], "batch": analysis["batch"]},
        "wave_quantization": analysis["wave"],
        "gemm_latency": dict(gemm_latency or {}),
        "kernel_floor": dict(kernel_floor or {}),
        "device_gap": dict(device_gap or {}),
        "memory_efficiency": dict(memory or {}),
        "conv_small_cin": dict(stem or {}),
        "attention": dict(attention or {}),
        "host": dict(host or {}),
        "optimizer_kernels": dict(optimizer_kernels or {}),
        "guide_claims": claims,
        "probe": {
            "mode": plan.mode,
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "method": "CUDA events (perf_counter on CPU), median of samples; each sample "
            "repeats the op to last about target_s; random inputs rotated when "
            "they fit in L2; cuDNN autotuning on",
            "repeats": cfg.repeats,
            "target_s": cfg.target_s,
            "timing": dict(timing),
        },
        "sweeps": {name: [_rounded(r) for r in rows] for name, rows in sweeps.items()},
    }


def _rounded(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in row.items()}


def dumps_profile(profile: Mapping[str, Any]) -> str:
    """Indented JSON, except that each sweep row sits on one line (the file stays readable)."""
    head = json.dumps({k: v for k, v in profile.items() if k != "sweeps"}, indent=1)
    blocks = []
    for name, rows in profile.get("sweeps", {}).items():
        lines = ",\n".join("   " + json.dumps(r, separators=(",", ":")) for r in rows)
        blocks.append(f'  "{name}": [\n{lines}\n  ]')
    return head[:-2] + ',\n "sweeps": {\n' + ",\n".join(blocks) + "\n }\n}\n"


def write_profile(profile: Mapping[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_profile(profile))
    return path
