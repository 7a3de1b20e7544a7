"""Rates of SDPA's memory-efficient kernel on short sequences, from `probe_window_attention.py`'s
kernel times, into a gpushape profile's "attention" rows ("efficient/fwd/d32@t49", ...).

The probe measures the efficient kernel at sequences of 1024 only (head sizes 64 and 128), and
the cost model used that rate for Swin-T's 49-token windows with 32-wide heads, pricing its 12
calls at 1.55 ms of a compiled H200 step that ran them in 2.73. Here each (head size, length)
the window probe timed gets its own rate, forward and backward: the GEMM model's compute time at
rate 1 (`gpushape.probe.attention.model_s`) over the measured kernel time, summed over the
shapes timed at that (head size, length), from the calls given `--bias` (default "bias 1hTT": on
Hopper with torch 2.11 SDPA runs cuDNN's kernel where no bias is given and the efficient one
where one is, so the rows without a bias say nothing about it). Kernels are sorted into forward
and backward by name here, so a run with the probe's older sorting fits the same.
`spec.attention_rate` then interpolates between lengths in log2 and takes the nearest head size.

    python benchmarks/kernels/fit_window_attention.py RESULTS.json [--profile P] [-o OUT] \
        [--scale-to OTHER_PROFILE]

--scale-to writes the same rows into another GPU's profile, each rate scaled by the ratio of
that GPU's efficient-kernel rate at 1024 tokens (its probe's, same head size or nearest) to this
one's: the window's slowdown against long sequences carried over. Checked once: the H100's
ratios put the H200's Swin-T calls (12 a step, compiled, loops-h200-5) at 0.89 ms forward and
1.73 backward against 0.91 and 1.82 measured; the 1024-token rate alone gave 0.38 and 1.17.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from probe_window_attention import BACKWARD, PROFILES  # noqa: E402  (a backward kernel's names)

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.attention import AttentionConfig, model_s  # noqa: E402
from gpushape.probe.memory import capped  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402


def parse(key: str) -> tuple[tuple[int, int, int, int], str]:
    """ "4096x3x49x32 bias 1hTT" -> ((4096, 3, 49, 32), "bias 1hTT")."""
    shape, _, bias = key.partition(" ")
    b, h, t, d = (int(x) for x in shape.split("x"))
    return (b, h, t, d), bias


def kernel_s(row: dict) -> tuple[float, float]:
    """The row's attention kernels' forward and backward seconds, sorted by name."""
    kernels = row.get("attention_kernels")
    if kernels is None:  # rows made by hand: their own split
        return row["attention_fwd_us"] * 1e-6, row["attention_bwd_us"] * 1e-6
    bwd = sum(us for n, us in kernels.items() if any(b in n for b in BACKWARD))
    return (sum(kernels.values()) - bwd) * 1e-6, bwd * 1e-6


def fit(rows: dict, spec, bias: str = "bias 1hTT") -> dict[str, dict]:
    """One profile row per (head size, length): "efficient/d32@t49" with its fwd and bwd rates."""
    sums: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0] * 6)
    shapes: dict[tuple[int, int], list[str]] = defaultdict(list)
    for key, row in rows.items():
        (b, h, t, d), kind = parse(key)
        if kind != bias:
            continue
        cfg = AttentionConfig("efficient", d, seq=t)
        fwd, bwd, flops_fwd, flops_bwd = model_s(spec, cfg, (b, h, t), torch.bfloat16)
        s = sums[(d, t)]
        s[0] += fwd
        s[1] += bwd
        s[4] += flops_fwd
        s[5] += flops_bwd
        measured_fwd, measured_bwd = kernel_s(row)
        s[2] += measured_fwd
        s[3] += measured_bwd
        shapes[(d, t)].append(f"{b}x{h}x{t}x{d}")
    out = {}
    for (d, t), (m_fwd, m_bwd, fwd, bwd, flops_fwd, flops_bwd) in sorted(sums.items()):
        cfg = AttentionConfig("efficient", d, seq=t)
        out[cfg.key(False).replace("/fwd", "")] = {
            cfg.key(False): capped(m_fwd, fwd),
            cfg.key(True): capped(m_bwd, bwd),
            "workload": f"efficient attention, head size {d}, sequences of {t}"
            + ("" if bias == "none" else f", {bias}"),
            "dtype": "bfloat16",
            "measured_fwd_s": fwd,
            "measured_bwd_s": bwd,
            "model_fwd_s": m_fwd,
            "model_bwd_s": m_bwd,
            "tflops_fwd": round(flops_fwd / fwd / 1e12, 1) if fwd > 0 else 0.0,
            "tflops_bwd": round(flops_bwd / bwd / 1e12, 1) if bwd > 0 else 0.0,
            "shapes": shapes[(d, t)],
            "source": "benchmarks/kernels/probe_window_attention.py, fit_window_attention.py",
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--profile", type=Path, default=None, help="default: the run's GPU's")
    p.add_argument("--bias", default="bias 1hTT", help='the calls to fit ("none", "bias BhTT")')
    p.add_argument("-o", "--output", type=Path, default=None, help="write the profile here")
    p.add_argument("--scale-to", type=Path, default=None, help="another GPU's profile (above)")
    args = p.parse_args()
    data = json.loads(args.results.read_text())
    gpu_name = data["environment"].get("gpu", "")
    path = args.profile or next((v for k, v in PROFILES.items() if k in gpu_name), None)
    if path is None:
        sys.exit(f"fit_window_attention.py: no profile for {gpu_name!r}; pass --profile")
    profile = read_profile(path)
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    rows = data["results"]["rows"]
    fitted = fit(rows, spec, args.bias)
    print(f"{'row':24} {'fwd rate':>9} {'bwd rate':>9}  shapes")
    for name, row in fitted.items():
        rates = [v for k, v in row.items() if k.startswith("efficient/")]
        print(f"{name:24} {rates[0]:9.4f} {rates[1]:9.4f}  {', '.join(row['shapes'])}")
    fitted_spec = apply_profile(spec, {"attention": fitted})
    print(f"\n{'call':34} {'fwd x':>6} {'bwd x':>6}   (the fitted rates' time / measured)")
    for key, row in rows.items():
        (b, h, t, d), kind = parse(key)
        if kind == "none":
            continue  # cuDNN's kernel, not the efficient one
        cfg = AttentionConfig("efficient", d, seq=t)
        m_fwd, m_bwd, _, _ = model_s(spec, cfg, (b, h, t), torch.bfloat16)
        r_fwd = fitted_spec.achievable.attention_rate("efficient", False, False, False, d, seq=t)
        r_bwd = fitted_spec.achievable.attention_rate("efficient", True, False, False, d, seq=t)
        measured_fwd, measured_bwd = kernel_s(row)
        x_fwd = m_fwd / r_fwd / max(measured_fwd, 1e-12)
        x_bwd = m_bwd / r_bwd / max(measured_bwd, 1e-12)
        print(f"{key:34} {x_fwd:6.2f} {x_bwd:6.2f}")
    if args.output:
        profile["attention"] = {**(profile.get("attention") or {}), **fitted}
        print(f"wrote {write_profile(profile, args.output)}")
    if args.scale_to:
        other = read_profile(args.scale_to)
        other["attention"] = {**(other.get("attention") or {}), **scaled(fitted, profile, other)}
        print(f"wrote {write_profile(other, args.scale_to)}")


def _long_only(profile: dict):
    """The profile's chip with its attention rows measured at the probe's own length only (no
    "@t" rows: the windows' rates are what is being scaled, not what scales them)."""
    rows = {k: v for k, v in (profile.get("attention") or {}).items() if "@t" not in k}
    return apply_profile(get_gpu(profile["gpu"]), {**profile, "attention": rows})


def scaled(fitted: dict, profile: dict, other: dict) -> dict[str, dict]:
    """`fitted` (measured on `profile`'s GPU) for another GPU's profile: each rate times that
    GPU's long-sequence rate over this one's (module docstring)."""
    here, there = _long_only(profile), _long_only(other)
    out = {}
    for name, row in fitted.items():
        # the times and rates measured here are not that GPU's: only the scaled rates go over
        new = {k: v for k, v in row.items() if k in ("workload", "dtype", "shapes")}
        for key, rate in row.items():
            if not key.startswith("efficient/"):
                continue
            backward = "/bwd/" in key
            d = int(key.rsplit("/d", 1)[1].split("@")[0])
            ratio = there.achievable.attention_rate(
                "efficient", backward, False, False, d
            ) / here.achievable.attention_rate("efficient", backward, False, False, d)
            new[key] = round(rate * ratio, 4)
        new["source"] = (
            f"{row['source']}: measured on {here.full_name}, scaled by {there.full_name}'s "
            "efficient-attention rate at 1024 tokens over that GPU's (--scale-to)"
        )
        out[name] = new
    return out


if __name__ == "__main__":
    main()
