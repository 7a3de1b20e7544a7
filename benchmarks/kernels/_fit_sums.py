"""What fit_bias_grad.py and fit_column_sums.py share: a sum's price at the copy rate, the
profile row a timing of it makes, and the command line that merges such rows into a profile."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.hardware.profile import read_profile  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.tracing.cost import op_cost  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"


class _Sum(nn.Module):
    """A bias gradient's sum: over rows of a matrix, or over batch and positions of NCHW."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0) if x.dim() == 2 else x.sum((0, 2, 3))


def copy_rate_s(spec, shape) -> float:
    """The cost model's price of the sum of a bf16 tensor of `shape`: its bytes at the copy
    rate alone, no family and no kernel floor (a small sum's time is its rate's to carry)."""
    flat = spec.replace(
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={}, kernel_floor_s=0.0)
    )
    x = torch.empty(*shape, dtype=torch.bfloat16, device="meta")
    return sum(op_cost(r, flat).memory_s for r in trace(_Sum(), (x,), train=False).ops)


def row(measured_s: float, model_s: float, workload: str) -> dict:
    """A memory_efficiency row: the copy-rate price over the measured time."""
    return {
        "efficiency": round(model_s / measured_s, 4),
        "workload": workload,
        "dtype": "bfloat16",
        "measured_s": measured_s,
        "family_roofline_s": model_s,
        "other_roofline_s": 0.0,
    }


def fit_main(doc: str, probe: str, fit: Callable[[dict, dict], dict], argv=None) -> int:
    """PROBE.json [--profile P] [-o OUT]: `fit(probe, profile)`'s rows merged into the profile."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("probe", help=f"{probe}'s JSON")
    p.add_argument("--profile", default=str(DEFAULT))
    p.add_argument("-o", "--output", help="where to write the profile (default: --profile)")
    args = p.parse_args(argv)
    profile = read_profile(args.profile)
    rows = fit(json.loads(Path(args.probe).read_text()), profile)
    profile["memory_efficiency"] = {**profile.get("memory_efficiency", {}), **rows}
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {len(rows)} figures into {out}")
    for name, r in rows.items():
        print(f"{name:28} {r['efficiency']:.4f} ({r['measured_s'] * 1e6:7.1f} us measured, "
              f"{r['family_roofline_s'] * 1e6:7.1f} us at the copy rate)")  # fmt: skip
    return 0
