"""Inductor's max-pool kernels' rate, from `bench_max_pool.py`'s timings, into a gpushape
profile as the family "pool_compiled": slow-max-pool prices PyTorch's max pool under
torch.compile with it. Also gpushape's own kernel on NCHW input ("fused_max_pool_nchw": the
probe measures it channels_last, "fused_max_pool"), its minimum bytes at the profile's copy
rate over its time.

The rate is the cost model's price of PyTorch's pool ops (forward and backward, their minimum
bytes at the profile's copy rate) over the time torch.compile's kernels took for the same pool,
at ResNet-50's stem shape in channels_last (the layout Inductor gives a training step's
convolutions), as the profile's "pool" family is for the eager kernels.

    python benchmarks/kernels/fit_max_pool.py benchmarks/results/kernels-h200/bench_max_pool.json \\
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o PROFILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.tracing.cost import op_cost  # noqa: E402
from gpushape.tracing.families import COMPILED_POOL, memory_family  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
SHAPE = [256, 64, 112, 112]
NCHW_KERNEL = "fused_max_pool_nchw"


def roofline_s(spec, shape: list[int], pool: tuple[int, int, int]) -> float:
    """PyTorch's max pool, forward and backward, its pool-family bytes at the copy rate."""
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    x = x.to(memory_format=torch.channels_last).requires_grad_()
    traced = trace(nn.MaxPool2d(*pool), (x,), train=True)
    return sum(
        op_cost(r, flat).memory_s for r in traced.ops if memory_family(r) in ("pool", "pool_nchw")
    )


def _row(bench: dict, variant: str, layout: str) -> dict:
    return next(
        r
        for r in bench["results"]
        if r["variant"] == variant
        and r["shape"] == SHAPE
        and r["layout"] == layout
        and r["direction"] == "fwd+bwd"
    )


def fit_nchw(bench: dict, profile: dict) -> dict:
    """The profile's "fused_max_pool_nchw" row."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    row = _row(bench, "gpushape", "nchw")
    measured = row["median_ms"] * 1e-3
    model = row["min_bytes"] / spec.attainable_bandwidth_bytes_per_s()
    return {
        "efficiency": round(model / measured, 4),
        "workload": f"gpushape max_pool2d on {'x'.join(map(str, SHAPE))} NCHW, forward and "
        "backward (bench_max_pool.py)",
        "dtype": "bfloat16",
        "measured_s": measured,
        "family_roofline_s": model,
        "other_roofline_s": 0.0,
    }


def fit(bench: dict, profile: dict) -> dict:
    """The profile's "pool_compiled" row."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    row = _row(bench, "compile", "cl")
    settings = bench["pool"]
    pool = (settings["kernel_size"], settings["stride"], settings["padding"])
    model = roofline_s(spec, SHAPE, pool)
    measured = row["median_ms"] * 1e-3
    return {
        "efficiency": round(model / measured, 4),
        "workload": f"torch.compile of F.max_pool2d{pool} on {'x'.join(map(str, SHAPE))} "
        "channels_last, forward and backward (bench_max_pool.py)",
        "dtype": "bfloat16",
        "measured_s": measured,
        "family_roofline_s": model,
        "other_roofline_s": 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", help="bench_max_pool.py's JSON")
    p.add_argument("--profile", default=str(DEFAULT))
    p.add_argument("-o", "--output", help="where to write the profile (default: --profile)")
    args = p.parse_args(argv)
    bench = json.loads(Path(args.bench).read_text())
    profile = read_profile(args.profile)
    row, nchw = fit(bench, profile), fit_nchw(bench, profile)
    profile["memory_efficiency"] = {
        **profile.get("memory_efficiency", {}),
        COMPILED_POOL: row,
        NCHW_KERNEL: nchw,
    }
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {out}")
    print(f"{COMPILED_POOL}: {row['efficiency']:.4f} ({row['measured_s'] * 1e3:.3f} ms measured, "
          f"{row['family_roofline_s'] * 1e3:.3f} ms at the copy rate)")  # fmt: skip
    print(f"{NCHW_KERNEL}: {nchw['efficiency']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
