"""PNG plots of the probe's sweeps, cliffs marked (matplotlib, Agg: no display needed).

Each function takes a profile (the dict `gpushape probe` writes) and a folder, writes one PNG
and returns its path, or None when the profile has no data for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the Agg backend

from .cliffs import Curve, slow_sizes, wave_efficiency
from .profile import conv_curves, curves_by, gemm_curves

_DPI = 110


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def _base(curve: Curve) -> int | None:
    """The sweep's centre size, from the label `curves_by` gives ("base 4096")."""
    tail = curve.label.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _draw_curve(
    ax: Any,
    curve: Curve,
    granularity: int,
    drop: float,
    scale: float = 1e12,
    base: int | None = None,
) -> None:
    """Throughput against size; slow points as red crosses, multiples of the cliff dotted.

    With a `base`, x is the offset from it on a symlog axis: offsets 0..16 spread out, 24..128
    compressed."""
    shift = base or 0
    ok = [(s - shift, t / scale) for s, t in zip(curve.sizes, curve.throughputs) if t]
    failed = [s - shift for s, t in zip(curve.sizes, curve.throughputs) if not t]
    slow = {s - shift for s in slow_sizes(curve, drop)}
    if ok:
        ax.plot([s for s, _ in ok], [t for _, t in ok], "-", color="0.75", zorder=1)
        fast = [(s, t) for s, t in ok if s not in slow]
        ax.scatter(
            [s for s, _ in fast],
            [t for _, t in fast],
            s=14,
            color="tab:blue",
            zorder=2,
            label="full speed",
        )
        cliff = [(s, t) for s, t in ok if s in slow]
        ax.scatter(
            [s for s, _ in cliff],
            [t for _, t in cliff],
            s=28,
            marker="x",
            color="tab:red",
            zorder=3,
            label=f"> {drop:.0%} below full speed",
        )
    if failed:
        ax.scatter(
            failed,
            [0.0] * len(failed),
            s=28,
            marker="v",
            color="black",
            zorder=3,
            label="did not run",
        )
    lo, hi = min(curve.sizes), max(curve.sizes)
    if base is not None:  # dotted lines only where the axis is linear, ticks as offsets
        lo, hi = max(lo, base - 16), min(hi, base + 16)
        ax.set_xscale("symlog", linthresh=16, linscale=2)
        ticks = [
            t for t in (-8, -4, 0, 4, 8, 12, 16, 32, 64, 128) if lo <= t + base <= max(curve.sizes)
        ]
        ax.set_xticks(ticks, [f"{t:+d}" if t else "0" for t in ticks], fontsize=7)
    if granularity > 1 and (hi - lo) / granularity <= 64:
        for x in range(math.ceil(lo / granularity) * granularity, hi + 1, granularity):
            ax.axvline(x - shift, color="tab:green", linestyle=":", linewidth=0.8, zorder=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def plot_gemm_align(
    profile: Mapping[str, Any], out_dir: Path, dtype: str, layout: str
) -> Path | None:
    sweeps = profile.get("sweeps", {})
    cliffs = profile.get("cliffs", {}).get("gemm", {}).get(layout, {}).get(dtype, {})
    dims = [d for d in ("M", "N", "K") if gemm_curves(sweeps, dtype, layout, d)]
    if not dims:
        return None
    bases = max(len(gemm_curves(sweeps, dtype, layout, d)) for d in dims)
    fig, axes = plt.subplots(
        len(dims), bases, figsize=(5.2 * bases, 3.0 * len(dims)), squeeze=False
    )
    for row, dim in enumerate(dims):
        cliff = cliffs.get(dim, {})
        g, drop = cliff.get("granularity", 1), cliff.get("drop_threshold", 0.2)
        for col, curve in enumerate(gemm_curves(sweeps, dtype, layout, dim)):
            ax = axes[row][col]
            _draw_curve(ax, curve, g, drop, base=_base(curve))
            ax.set_title(f"{dim} moves around {_base(curve)}; cliff granularity {g}", fontsize=9)
            ax.set_xlabel(f"{dim} (offset from {_base(curve)}, symlog)")
            ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7, loc="lower right")
    lay = "A @ B" if layout == "nn" else "x @ W^T (F.linear)"
    fig.suptitle(
        f"{dtype} GEMM ({lay}), dotted lines: multiples of the measured granularity", fontsize=10
    )
    return _save(fig, out_dir / f"gemm-align-{dtype}-{layout}.png")


def plot_conv_channels(profile: Mapping[str, Any], out_dir: Path, dtype: str) -> Path | None:
    sweeps = profile.get("sweeps", {})
    names = sorted({r["sweep"] for r in sweeps.get("conv_channels", []) if r["dtype"] == dtype})
    if not names:
        return None
    cliffs = profile.get("cliffs", {}).get("conv", {}).get(dtype, {})
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        cliff = cliffs.get(name, {})
        g = cliff.get("granularity", 1)
        for curve in conv_curves(sweeps, dtype, name):
            _draw_curve(ax, curve, g, cliff.get("drop_threshold", 0.2), base=_base(curve))
        ax.set_title(f"{name}; cliff granularity {g}", fontsize=9)
        ax.set_xlabel("channels (offset from the base, symlog)")
        ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{dtype} convolution, channels_last, cuDNN autotuned", fontsize=10)
    return _save(fig, out_dir / f"conv-channels-{dtype}.png")


def plot_batch(profile: Mapping[str, Any], out_dir: Path) -> Path | None:
    sweeps = profile.get("sweeps", {})
    names = [n for n in ("gemm_batch", "conv_batch") if sweeps.get(n)]
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(6.0 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        cliff = profile.get("cliffs", {}).get("batch", {}).get(name, {})
        for curve in curves_by(sweeps[name], {}, "dtype"):
            _draw_curve(ax, curve, cliff.get("granularity", 1), cliff.get("drop_threshold", 0.2))
        ax.set_xscale("log", base=2)
        what = "Linear 4096->4096, M = batch" if name == "gemm_batch" else "3x3 conv, N = batch"
        ax.set_title(f"{what}; cliff granularity {cliff.get('granularity', '-')}", fontsize=9)
        ax.set_xlabel("batch (log scale)")
        ax.set_ylabel("TFLOP/s (proportional to samples/s)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    return _save(fig, out_dir / "batch.png")


def plot_wave(profile: Mapping[str, Any], out_dir: Path) -> Path | None:
    wave = profile.get("wave_quantization", {})
    rows = sorted(
        (r["m"], r["flops_per_s"])
        for r in profile.get("sweeps", {}).get("wave", [])
        if r.get("flops_per_s")
    )
    if not rows or "tile" not in wave:
        return None
    ms, tflops = [m for m, _ in rows], [t / 1e12 for _, t in rows]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(ms, tflops, "o-", ms=3, label="measured")
    tile, sms, n = wave["tile"], wave["sm_count"], wave["n"]
    eff = [wave_efficiency(math.ceil(m / tile[0]) * math.ceil(n / tile[1]), sms) for m in ms]
    ax.plot(
        ms,
        [e * max(tflops) for e in eff],
        "--",
        color="tab:orange",
        label=f"max x wave efficiency, tile {tile[0]}x{tile[1]}, {sms} SMs",
    )
    ax.set_xlabel(f"M (N = K = {n})")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(
        f"wave quantization: r = {wave['correlation']:.2f}, "
        f"{'found' if wave['found'] else 'not found'}",
        fontsize=10,
    )
    return _save(fig, out_dir / "wave.png")


def plot_claims(profile: Mapping[str, Any], out_dir: Path) -> Path | None:
    claims = [c for c in profile.get("guide_claims", []) if c.get("gain") is not None]
    if not claims:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(claims) + 1.4))
    ys = range(len(claims))
    ax.barh(
        [y + 0.2 for y in ys],
        [c["claimed_gain"] for c in claims],
        height=0.4,
        color="0.7",
        label="the guide claims",
    )
    colors = {"holds": "tab:green", "holds only partly": "tab:orange", "within noise": "0.45"}
    ax.barh(
        [y - 0.2 for y in ys],
        [c["gain"] for c in claims],
        height=0.4,
        color=[colors.get(c["verdict"], "tab:red") for c in claims],
        label="measured here (green holds, orange partly, red does not, grey within noise)",
    )
    ax.set_yticks(list(ys), [c["id"] for c in claims], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=0.1)
    values = [c["gain"] for c in claims] + [c["claimed_gain"] for c in claims]
    ticks = [
        t
        for t in (-1, -0.5, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 5, 10, 100, 1000)
        if min(*values, 0) <= t <= max(*values, 0.25)
    ]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=7)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("gain of the guide's advice (0.26 = 26% faster; symlog scale)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out_dir / "guide-claims.png")
