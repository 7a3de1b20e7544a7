"""Fit the host's cost of a foreach optimizer step beyond the fused one, per parameter tensor,
from the loops timed on the H200 (their `+ fused-optimizer` stage against the stage before), on
this machine.

A foreach step (PyTorch's default on CUDA) issues a dozen multi-tensor ops, but before them
Python builds lists of per-tensor floats (AdamW's bias corrections and step sizes); the fused
step hands every tensor to one kernel. Hugging Face GPT-2 with AdamW issued its eager step
3.6 ms faster once fused, on two leases: a cost the host model (forward, backward) never saw,
so the audit priced optimizer-not-fused at its GPU saving alone (0.76 ms) where the host set
the pace. Here each loop's parameter tensors are counted on the meta device, and the rate per
optimizer class is the median of (issue time before - after) / tensors. --write-profile puts
it into the shipped H200 profile as host rates `optimizer_foreach_tensor/<class>`.

    python benchmarks/steps/fit_optimizer_host.py --write-profile \\
        --out benchmarks/results/steps-h200/optimizer_host_fit.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.tracing.host import FOREACH_HOST  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
PROFILE = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"
# eager loops with a fused-optimizer stage; the optimizer `gpushape bench` built ("auto": SGD for
# image models, AdamW for the rest)
LOOPS = (
    ("bench-h200/loop-hf_gpt2-eager.json", "hf:gpt2", "AdamW"),
    ("loops-h200-2/loop-hf_gpt2-eager.json", "hf:gpt2", "AdamW"),
    ("bench-h200/loop-timm_vit_base_patch16_224-eager.json", "timm:vit_base_patch16_224", "SGD"),
    ("bench-h200/loop-timm_swin_tiny_patch4_window7_224-eager.json",
     "timm:swin_tiny_patch4_window7_224", "SGD"),
    ("bench-h200/loop-timm_efficientnet_b0-eager.json", "timm:efficientnet_b0", "SGD"),
    ("bench-h200/loop-timm_mobilenetv3_large_100-eager.json", "timm:mobilenetv3_large_100",
     "SGD"),
)  # fmt: skip
STAGE = "+ fused-optimizer"


def tensors(model: str) -> int:
    r = resolve_model(model)
    return sum(1 for p in r.model.parameters() if p.requires_grad)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(RESULTS / "steps-h200/optimizer_host_fit.json"))
    p.add_argument("--write-profile", action="store_true")
    args = p.parse_args()
    rows = []
    for name, model, cls in LOOPS:
        stages = json.loads((RESULTS / name).read_text())["stages"]
        names = list(stages)
        before = stages[names[names.index(STAGE) - 1]]
        after = stages[STAGE]
        n = tensors(model)
        saved = before["issue_s"] - after["issue_s"]
        rows.append({
            "file": name, "model": model, "optimizer": cls, "tensors": n,
            "issue_before_s": before["issue_s"], "issue_after_s": after["issue_s"],
            "issue_saved_s": saved, "per_tensor_s": saved / n,
        })  # fmt: skip
    rates = {}
    for cls in sorted({r["optimizer"] for r in rows}):
        used = [r for r in rows if r["optimizer"] == cls]
        rates[f"{FOREACH_HOST}/{cls}"] = {
            "seconds": statistics.median(r["per_tensor_s"] for r in used),
            "workload": f"host seconds per parameter tensor of a foreach {cls} step beyond the "
            f"fused one: eager issue time before - after the loop's fused-optimizer stage, over "
            f"the model's tensors, median of {len(used)} loop runs on the H200",
            "calls": len(used),
        }
    write_results(args.out, {"rates": rates, "rows": rows})
    if args.write_profile:
        profile = json.loads(PROFILE.read_text())
        profile["host"].update(rates)
        write_profile(profile, PROFILE)
    for key, entry in rates.items():
        print(f"{key} {entry['seconds'] * 1e6:.1f} us a tensor (median of {entry['calls']})")
    print(f"{'file':62} {'tensors':>7} {'issue saved ms':>14} {'us/tensor':>9}")
    for r in rows:
        print(f"{r['file']:62} {r['tensors']:>7} {r['issue_saved_s'] * 1e3:14.2f} "
              f"{r['per_tensor_s'] * 1e6:9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
