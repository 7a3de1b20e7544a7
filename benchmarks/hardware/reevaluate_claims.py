"""The guide's claims that the probe judges from its sweeps, judged again from the sweeps two
saved probes hold (the quick and the full run on one GPU), with the current claim code. No GPU
needed: it shows whether the two probes' verdicts differ because of what they measured or
because of how a claim pools it. Each probe is also judged on only the sweep points the quick
probe measures (`--at-quick-points`).

    python benchmarks/hardware/reevaluate_claims.py \
        --quick benchmarks/results/probe-h200-quick/h200-sxm.json \
        --full benchmarks/results/probe-h200/h200-sxm.json -o reevaluated_claims.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.bench import write_results  # noqa: E402
from gpushape.hardware import get_gpu  # noqa: E402
from gpushape.probe.claim_check import ClaimContext, run_claims  # noqa: E402
from gpushape.probe.guide_claims import REGISTRY  # noqa: E402
from gpushape.probe.plan import QUICK_CHANNEL_OFFSETS, MeasureConfig, quick_plan  # noqa: E402

# claims judged from the sweeps alone (the others time their own workloads on the GPU)
FROM_SWEEPS = ("tensor-core-multiple-of-8", "dims-multiple-of-32")


def at_quick_points(sweeps: dict) -> dict:
    """The sweep rows the quick probe measures too."""
    plan = quick_plan()
    out = dict(sweeps)
    out["gemm_align"] = [
        r
        for r in sweeps.get("gemm_align", [])
        if r["base"] in plan.align_bases
        and r["size"] - r["base"] in plan.align_offsets
        and r["dtype"] in plan.align_dtypes
    ]
    out["conv_channels"] = [
        r
        for r in sweeps.get("conv_channels", [])
        if r.get("size", 0) - r.get("base", 0) in QUICK_CHANNEL_OFFSETS
    ]
    return out


def judge(profile: dict, gpu: str, quick_points: bool) -> list[dict]:
    sweeps = profile["sweeps"]
    ctx = ClaimContext(
        cfg=MeasureConfig(device="cpu"),
        mode="full",
        spec=get_gpu(gpu),
        sweeps=at_quick_points(sweeps) if quick_points else sweeps,
        analysis=profile.get("cliffs", {}),
    )
    return run_claims([REGISTRY[c] for c in FROM_SWEEPS], ctx)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", required=True)
    p.add_argument("--full", required=True)
    p.add_argument("--gpu", default="h200")
    p.add_argument("-o", "--out", default="reevaluated_claims.json")
    args = p.parse_args()
    rows = []
    for name, path in (("quick", args.quick), ("full", args.full)):
        profile = json.loads(Path(path).read_text())
        saved = {c["id"]: c for c in profile["guide_claims"]}
        for points in (False, True):
            for r in judge(profile, args.gpu, points):
                rows.append(
                    {
                        "probe": name,
                        "points": "quick's" if points else "all",
                        "claim": r["id"],
                        "gain": r["gain"],
                        "verdict": r["verdict"],
                        "saved_gain": saved.get(r["id"], {}).get("gain"),
                        "saved_verdict": saved.get(r["id"], {}).get("verdict"),
                    }
                )
    write_results(args.out, rows, quick=args.quick, full=args.full, gpu_profile=args.gpu)
    print(f"{'probe':6} {'points':7} {'claim':28} {'gain':>7} {'verdict':18} {'as saved':>28}")
    for r in rows:
        saved = f"{r['saved_gain']} {r['saved_verdict']}"
        print(f"{r['probe']:6} {r['points']:7} {r['claim']:28} {r['gain']:7.3f} "
              f"{r['verdict']:18} {saved:>28}")  # fmt: skip


if __name__ == "__main__":
    main()
