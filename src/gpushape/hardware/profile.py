"""Calibrated profiles: what `gpushape probe` measured, applied over the datasheet.

Format (JSON, `"format": "gpushape-profile"`, `"version": 1`)::

    {
      "format": "gpushape-profile", "version": 1,
      "gpu": "h200-sxm",                 # catalog name the measurements belong to
      "device_name": "NVIDIA H200",      # as the driver reported it
      "measured_at": "2026-11-30T07:00:00Z",
      "software": {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"},
      "device": {"sm_count": 132, "memory_bytes": ..., "l2_bytes": ...},   # driver facts
      "ceilings": {
        "copy_bytes_per_s": 4.22e12,                  # read + written bytes / time
        "gemm_flops": {"bf16": 7.9e14, "tf32": ...},  # large aligned GEMM, by dtype key
        "launch_overhead_s": 6.9e-6,                  # one tiny kernel, eager
        "graph_launch_overhead_s": 1.1e-6             # the same, replayed from a CUDA graph
      },
      "tc_align_elems": {"bf16": 8, "fp16": 8, ...},  # measured cliff granularity, elements
      "memory_efficiency": {                          # eager kernels' bandwidth / copy rate,
        "norm": {"efficiency": 0.34, ...}, ...},      # by family (tracing/families.py)
      "conv_small_cin": {"efficiency": 0.1, ...},     # an RGB stem conv / the GEMM model's rate
      "attention": {"flash/d64": {"flash/fwd/d64": 0.5, "flash/bwd/d64": 0.4, ...}, ...},
                                          # fused attention / the GEMM model's rate, per pass
      "host": {"op": {"seconds": 8e-6, ...}, ...},    # the host's side of a step, per call
      "device_gap": {"compile": {"seconds": 2.9e-6, "steps": 22, ...}, ...},
                          # the GPU's idle time between kernels, by how the step runs (eager,
                          # compile, graph, compile-graphs), fitted on timed GPU-bound steps
      "optimizer_kernels": {"foreach": {"efficiency": 0.8, "tensor_seconds": 1.4e-7}, ...},
                          # an optimizer step's multi-tensor kernels, fitted on timed steps
      "sweeps": {...}                                 # raw sweep data (optional, free-form)
    }

Every key but "format", "version" and "gpu" is optional: what is absent keeps the datasheet.

Keys `gpushape probe` adds as evidence (reports read them; `apply_profile` does not)::

      "ceilings": {...,
        "gemm_flops_cuda_cores": {"fp32": 5.1e13},    # fp32 GEMM with TF32 off (CUDA cores)
        "gemm_peak_sizes": [4096, 8192]},             # square GEMMs the peaks are the best of
      "tc_align_elems": {"fp32": 4, ...},             # fp32: the cliff of the TF32-off sweep
      "cliffs": {"gemm": {layout: {dtype: {dim: {"granularity": 8, "evidence": ..., ...}}}},
                 "conv": {dtype: {"3x3 cin": {...}}}, "batch": {"conv_batch": {...}}},
      "wave_quantization": {"tile": [128, 256], "correlation": 0.93, "found": true, ...},
      "guide_claims": [{"id": ..., "says": ..., "claimed": ..., "gain": ..., "verdict": ...}],
      "probe": {"mode": "full", "command": ..., "method": ..., "timing": {...}},
      "sweeps": {"gemm_align": [{"dtype": "bf16", "layout": "nn", "m": 8192, "n": 8192,
                                 "k": 4095, "dim": "K", "base": 4096, "size": 4095,
                                 "time_s": ..., "flops_per_s": ...}, ...], ...}

A profile shipped with gpushape for a catalog chip lives in `hardware/profiles/<name>.json`;
`calibrated(spec)` applies it (`bundled_profile_path(spec)` says whether there is one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from .lookup import get_gpu
from .spec import Achievable, GPUSpec, dtype_key

PROFILE_FORMAT = "gpushape-profile"
PROFILE_VERSION = 1
_DEVICE_FIELDS = ("sm_count", "memory_bytes", "l2_bytes")


def read_profile(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile {str(path)!r}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ProfileError(
            f'{str(path)!r} is not a gpushape profile (no "format": "{PROFILE_FORMAT}")'
        )
    if data.get("version") != PROFILE_VERSION:
        raise ProfileError(
            f"profile {str(path)!r} has version {data.get('version')!r}; "
            f"this gpushape reads version {PROFILE_VERSION}"
        )
    if "gpu" not in data:
        raise ProfileError(f'profile {str(path)!r} names no "gpu"')
    return data


def apply_profile(spec: GPUSpec, profile: dict[str, Any], origin: str = "profile") -> GPUSpec:
    """`spec` with the profile's measurements in place of datasheet assumptions."""
    note = f"measured ({origin})"
    device = {k: int(v) for k, v in profile.get("device", {}).items() if k in _DEVICE_FIELDS}
    if device:
        spec = spec.replace(note=note, **device)
    ceilings = profile.get("ceilings", {})
    old = spec.achievable
    fields: dict[str, Any] = {}
    if "copy_bytes_per_s" in ceilings:
        copy_rate = ceilings["copy_bytes_per_s"]
        fields["memory_bandwidth_fraction"] = copy_rate / spec.memory_bandwidth_bytes_per_s
    if "gemm_flops" in ceilings:
        fractions = dict(old.gemm_fraction)
        for dtype, flops in ceilings["gemm_flops"].items():
            key = dtype_key(dtype)
            fractions[key] = flops / spec.peak_flops(key)
        fields["gemm_fraction"] = fractions
    for key in ("launch_overhead_s", "graph_launch_overhead_s"):
        if key in ceilings:
            fields[key] = float(ceilings[key])
    latency = profile.get("gemm_latency", {})
    if isinstance(latency, dict) and latency.get("seconds") is not None:
        fields["gemm_latency_s"] = float(latency["seconds"])
    floor = profile.get("kernel_floor", {})
    if isinstance(floor, dict) and floor.get("seconds") is not None:
        fields["kernel_floor_s"] = float(floor["seconds"])
    efficiency = {
        family: float(row["efficiency"])
        for family, row in profile.get("memory_efficiency", {}).items()
        if isinstance(row, dict) and row.get("efficiency")
    }
    if efficiency:
        fields["memory_efficiency"] = {**old.memory_efficiency, **efficiency}
    stem = profile.get("conv_small_cin", {})
    if isinstance(stem, dict) and stem.get("efficiency"):
        fields["small_cin_conv"] = float(stem["efficiency"])
    attention = attention_rates(profile.get("attention", {}))
    if attention:
        fields["attention"] = {**old.attention, **attention}
    host = {
        k: float(v["seconds"])
        for k, v in profile.get("host", {}).items()
        if isinstance(v, dict) and v.get("seconds")
    }
    if host:
        fields["host"] = {**old.host, **host}
    gap = {
        k: float(v["seconds"])
        for k, v in profile.get("device_gap", {}).items()
        if isinstance(v, dict) and v.get("seconds") is not None
    }
    gap.update(  # a time a step beside the time a kernel, where the fit found one
        (f"{k}/step", float(v["step_seconds"]))
        for k, v in profile.get("device_gap", {}).items()
        if isinstance(v, dict) and v.get("step_seconds")
    )
    if gap:
        fields["device_gap"] = {**old.device_gap, **gap}
    kernels = optimizer_kernel_rates(profile.get("optimizer_kernels", {}))
    if kernels:
        fields["optimizer_kernels"] = {**old.optimizer_kernels, **kernels}
    if fields:
        measured = tuple(sorted(set(old.measured) | set(fields)))
        achievable = Achievable(
            **{
                **{
                    f: getattr(old, f)
                    for f in (
                        "gemm_fraction",
                        "memory_bandwidth_fraction",
                        "launch_overhead_s",
                        "graph_launch_overhead_s",
                        "gemm_latency_s",
                        "kernel_floor_s",
                        "memory_efficiency",
                        "small_cin_conv",
                        "attention",
                        "host",
                        "device_gap",
                        "optimizer_kernels",
                    )
                },
                **fields,
            },
            source=note,
            measured=measured,
        )
        spec = spec.replace(note=note, achievable=achievable)
    if profile.get("tc_align_elems"):
        align = dict(spec.tc_align_elems)
        align.update({dtype_key(k): int(v) for k, v in profile["tc_align_elems"].items()})
        spec = spec.replace(note=note, tc_align_elems=align)
    return spec


def optimizer_kernel_rates(rows: Mapping[str, Any]) -> dict[str, float]:
    """A profile's "optimizer_kernels" rows ({"fused/AdamW": {"efficiency": 0.76,
    "tensor_seconds": 2.3e-7, ...}}) flattened to what `Achievable.optimizer_kernels` holds
    ({"fused/AdamW": 0.76, "fused/AdamW/tensor": 2.3e-7})."""
    out: dict[str, float] = {}
    for key, row in rows.items():
        if not isinstance(row, Mapping):
            continue
        if row.get("efficiency"):
            out[key] = float(row["efficiency"])
        if row.get("tensor_seconds") is not None:
            out[f"{key}/tensor"] = float(row["tensor_seconds"])
    return out


def attention_rates(rows: Mapping[str, Any]) -> dict[str, float]:
    """A profile's "attention" rows flattened to {"flash/fwd/d64": rate, ...} (what
    `Achievable.attention` holds); failed rows (no rates) contribute nothing."""
    return {
        key: float(value)
        for row in rows.values()
        if isinstance(row, Mapping)
        for key, value in row.items()
        if "/" in key and isinstance(value, (int, float)) and value > 0
    }


def load_profile(path: str | Path) -> GPUSpec:
    """The catalog chip a profile names, calibrated by it."""
    profile = read_profile(path)
    return apply_profile(get_gpu(profile["gpu"]), profile, origin=str(path))


PROFILES_DIR = Path(__file__).with_name("profiles")


def bundled_profile_path(spec: GPUSpec | str) -> Path | None:
    """The profile shipped for this chip (`hardware/profiles/<name>.json`), or None."""
    path = PROFILES_DIR / f"{get_gpu(spec).name}.json"
    return path if path.is_file() else None


def calibrated_by(spec: GPUSpec) -> str | None:
    """Where `apply_profile` took `spec`'s measured numbers from (its `origin`), or None for a
    spec it never calibrated (a catalog entry, the driver's facts on one)."""
    note = spec.overridden.get("achievable")
    return note.removeprefix("measured (").removesuffix(")") if note else None


def calibrated(spec: GPUSpec | str) -> GPUSpec:
    """`spec` calibrated by the profile shipped for its chip; the datasheet spec when none is.
    A spec already calibrated (`calibrated_by`) is returned as it is."""
    spec = get_gpu(spec)
    if calibrated_by(spec) is not None:
        return spec
    path = bundled_profile_path(spec)
    if path is None:
        return spec
    profile = read_profile(path)
    if get_gpu(profile["gpu"]).name != spec.name:
        raise ProfileError(
            f"bundled profile {path.name} is for {profile['gpu']!r}, not {spec.name!r}"
        )
    device, when = profile.get("device_name", profile["gpu"]), profile.get("measured_at", "?")
    return apply_profile(spec, profile, origin=f"gpushape probe on {device}, {when}: {path.name}")
