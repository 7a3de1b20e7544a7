"""Sums down to one value a channel, by rows and channels, from `probe_column_sums.py`'s
timings, into a gpushape profile as "reduction@<rows>x<channels>" (column sums: a Linear's or
a channels_last convolution's bias gradient) and "channel_sum@<rows>x<channels>" (NCHW
per-channel sums). The cost model then prices each such sum at the grid point nearest its own
shape (tracing/sums.py) instead of by its width alone.

Each figure is the cost model's price of the sum (its minimum bytes at the profile's copy rate,
every memory family's efficiency and the kernel floor left out) over the time measured from
CUDA graphs: a small sum's time is its rate's to carry, so the model then prices it at what
was measured rather than at the floor.

    python benchmarks/kernels/fit_column_sums.py column_sums.json \\
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
from gpushape.tracing.sums import CHANNEL_SUM, COLUMN_SUM  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
FAMILY = {"columns": COLUMN_SUM, "nchw": CHANNEL_SUM}


class _Sum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0) if x.dim() == 2 else x.sum((0, 2, 3))


def roofline_s(spec, shape: list[int]) -> float:
    """The cost model's price of the sum of a bf16 tensor of `shape` at the copy rate."""
    flat = spec.replace(  # bytes over the copy rate alone: no family, no kernel floor
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={}, kernel_floor_s=0.0)
    )
    x = torch.empty(*shape, dtype=torch.bfloat16, device="meta")
    return sum(op_cost(r, flat).memory_s for r in trace(_Sum(), (x,), train=False).ops)


def fit(probe: dict, profile: dict) -> dict[str, dict]:
    """The profile's grid figures, one per timed (layout, rows, channels)."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    date = probe["environment"]["date_utc"][:10]
    out = {}
    for row in probe["results"]:
        family = FAMILY.get(row.get("layout"))
        if family is None or not row.get("graph_us"):
            raise SystemExit(f"not a probe_column_sums.py row: {row}")
        measured = row["graph_us"] * 1e-6
        model = roofline_s(spec, row["shape"])
        what = "columns of" if family == COLUMN_SUM else "channels of NCHW"
        out[f"{family}@{row['rows']}x{row['channels']}"] = {
            "efficiency": round(model / measured, 4),
            "workload": f"sum into {row['channels']} {what} {'x'.join(map(str, row['shape']))}"
            f", CUDA graphs (probe_column_sums.py, {date})",
            "dtype": "bfloat16",
            "measured_s": measured,
            "family_roofline_s": model,
            "other_roofline_s": 0.0,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", help="probe_column_sums.py's JSON")
    p.add_argument("--profile", default=str(DEFAULT))
    p.add_argument("-o", "--output", help="where to write the profile (default: --profile)")
    args = p.parse_args(argv)
    probe = json.loads(Path(args.probe).read_text())
    profile = read_profile(args.profile)
    rows = fit(probe, profile)
    profile["memory_efficiency"] = {**profile.get("memory_efficiency", {}), **rows}
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {len(rows)} figures into {out}")
    for name, row in rows.items():
        print(f"{name:28} {row['efficiency']:.3f} ({row['measured_s'] * 1e6:7.1f} us measured, "
              f"{row['family_roofline_s'] * 1e6:7.1f} us at the copy rate)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
