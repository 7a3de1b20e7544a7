"""Re-derive memory families' efficiencies from the GPU times a profile already holds, after the
cost model changed what it counts for those families, or after they were calibrated against
another chip's numbers. No GPU needed.

    python benchmarks/hardware/rederive_memory_efficiency.py --families norm,norm@96 \
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o out.json] [--why TEXT]

A family's efficiency is family_s / (measured_s - other_s) (`gpushape.probe.memory`): measured_s
is the GPU's step time, family_s and other_s are the cost model's. When the model changes the
bytes or kernels it prices for a family (the second read of a LayerNorm backward's weight
gradients, tracing/norm_grads.py), the measured step still stands: this recomputes family_s and
other_s with the current model on the family's workload (built on the meta device, at full
size) and the efficiency from the stored measured_s, and marks the row "rederived" (when, why,
and the family_s it had). s2d-stem's folded convolutions ("s2d_stem", "s2d_stem@<side>") are
rates against the GEMM model: their model_s is recomputed the same way
(`gpushape.probe.convs.s2d_stem_workload`). calibrate_memory_efficiency.py on the GPU measures
them afresh.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.convs import rate_model_s, s2d_stem_workload  # noqa: E402
from gpushape.probe.memory import WORKLOADS, capped, modeled_s  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
WHY = "the cost model's bytes for this family changed; measured_s is the GPU's"


def rederive(row: dict, family: str, spec, why: str = WHY) -> dict:
    """`row` (a profile's memory_efficiency entry for `family`) with family_s, other_s and the
    efficiency recomputed from its measured_s by the current cost model on `spec`."""
    work = next(w for w in WORKLOADS if w.family == family)
    if "scale" in row or work.build is None:
        raise ValueError(f"{family}: not a full-size workload; measure it on the GPU")
    if family.startswith("s2d_stem"):
        with torch.device("meta"):
            _, _, conv, batch, _, folded = s2d_stem_workload(work)
        family_s, other_s = rate_model_s(spec, conv, batch, folded), 0.0
        fields = {"model_s": family_s, "family_roofline_s": family_s}
    elif work.measure is not None:
        raise ValueError(f"{family}: not a traced workload; measure it on the GPU")
    else:
        with torch.device("meta"):
            model = work.build(1.0).to(torch.bfloat16)
        family_s, other_s = modeled_s(work, model, spec)
        fields = {"family_roofline_s": family_s, "other_roofline_s": other_s}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        **row,
        "efficiency": capped(family_s, row["measured_s"] - other_s),
        **fields,
        "rederived": {
            "at": stamp,
            "from_family_roofline_s": row.get("family_roofline_s"),
            "from_efficiency": row.get("efficiency"),
            "why": why,
            # the row's earlier re-derivations, newest first: none of their reasons is lost
            **(
                {"before": [_latest(row["rederived"]), *row["rederived"].get("before", [])]}
                if "rederived" in row
                else {}
            ),
        },
    }


def _latest(rederived: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rederived.items() if k != "before"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT)
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: over --profile")
    parser.add_argument("--families", required=True, help="comma-separated memory families")
    parser.add_argument("--why", default=WHY, help="the reason, kept in each row")
    args = parser.parse_args()
    profile = read_profile(args.profile)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(args.profile))
    rows = profile.get("memory_efficiency") or {}
    for family in args.families.split(","):
        if family not in rows or "measured_s" not in rows[family]:
            sys.exit(f"rederive_memory_efficiency.py: {family!r} has no measured_s in the profile")
        old = rows[family]["efficiency"]
        rows[family] = rederive(rows[family], family, spec, args.why)
        print(f"{family:<12} {old:.4f} -> {rows[family]['efficiency']:.4f}")
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
