"""PyTorch's column sums (a Linear's bias gradient, `grad.sum(0)`) by width, from
`probe_bias_grad.py`'s timings, into a gpushape profile as "reduction@<width>"
(tracing/families.py `SIZE_BASE`): the cost model then prices a bias gradient at the rate
measured for the width nearest its own, not at the 1024-wide sum over 65536 rows the probe's
"reduction" measures. `gpushape probe` measures the same widths itself (probe/workloads); this
fills them in from the committed run without a GPU.

Each row: PyTorch's `sum(0)` at 16384 rows (BERT's and ViT's tokens a step), its time from
CUDA graphs, against the cost model's price of the op (its minimum bytes at the profile's copy
rate, every memory family's efficiency left out).

    python benchmarks/kernels/fit_bias_grad.py \\
        benchmarks/results/kernels-h200/probe_bias_grad.json \\
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
from gpushape.tracing.families import SIZE_VARIANTS  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
ROWS = 16384
VARIANT = "torch sum(0)"
WIDTHS = tuple(int(f.partition("@")[2]) for f in SIZE_VARIANTS if f.startswith("reduction@"))


class _ColumnSum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)


def roofline_s(spec, rows: int, width: int) -> float:
    """The cost model's price of `sum(0)` over rows x width bf16 at the copy rate."""
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    x = torch.empty(rows, width, dtype=torch.bfloat16, device="meta")
    traced = trace(_ColumnSum(), (x,), train=False)
    return sum(op_cost(r, flat).memory_s for r in traced.ops)


def fit(probe: dict, profile: dict) -> dict[str, dict]:
    """The profile's "reduction@<width>" rows, one per width the probe timed at ROWS rows."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    date = probe["environment"]["date_utc"][:10]
    out = {}
    for width in WIDTHS:
        row = next(
            (
                r
                for r in probe["results"]
                if r["shape"] == [ROWS, width] and r["variant"] == VARIANT
            ),
            None,
        )
        if row is None:
            raise SystemExit(f"{VARIANT} at {ROWS}x{width} is not in the probe's results")
        measured = row["graph_us"] * 1e-6
        model = roofline_s(spec, ROWS, width)
        out[f"reduction@{width}"] = {
            "efficiency": round(model / measured, 4),
            "workload": f"sum over rows of {ROWS}x{width} (a bias gradient), CUDA graphs "
            f"(probe_bias_grad.py, {date})",
            "dtype": "bfloat16",
            "measured_s": measured,
            "family_roofline_s": model,
            "other_roofline_s": 0.0,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", help="probe_bias_grad.py's JSON")
    p.add_argument("--profile", default=str(DEFAULT))
    p.add_argument("-o", "--output", help="where to write the profile (default: --profile)")
    args = p.parse_args(argv)
    probe = json.loads(Path(args.probe).read_text())
    profile = read_profile(args.profile)
    rows = fit(probe, profile)
    profile["memory_efficiency"] = {**profile.get("memory_efficiency", {}), **rows}
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {out}")
    for name, row in rows.items():
        print(f"{name}: {row['efficiency']:.4f} ({row['measured_s'] * 1e6:.1f} us measured, "
              f"{row['family_roofline_s'] * 1e6:.1f} us at the copy rate)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
