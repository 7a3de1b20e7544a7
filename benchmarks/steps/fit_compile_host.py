"""Fit the host's cost per kernel of a torch.compile'd training step, from steps timed on the
H200 (bench-h200/*.json: `gpushape bench` runs whose `compile` variant, or whose compile-mode
loop's stage "as given", compiled the model as given), on this machine.

A compiled step still issues every kernel from Python: Inductor's wrapper code allocates each
buffer and calls a launcher per Triton kernel, extern kernels (cuBLAS, cuDNN) go through ATen,
and autograd runs the compiled backward. `gpushape bench` records each variant's issue time
(one step issued from an idle GPU, `issue_s`) and its kernels. Measured on the H200: 31-57 us
of host per kernel, against 6-9 us for a bare eager launch, so a compiled step the audit
priced as GPU-bound ran host-bound (MobileNetV3 at batch 64: 6.4 ms of GPU work in a 37.8 ms
step). Here each model is re-traced on the meta device at the batch it ran, its kernels
counted as the audit counts a compiled step's (`modes.compiled_kernels`), and the rate is the
median of issue seconds / kernels over the runs whose issue time is the host's own: a GPU-bound step
issued in about its GPU time (within `THROTTLED` of it) was held back by the GPU (the launch
queue fills, and the host waits), so its issue time says how long the GPU took, not the host.
--write-profile puts it into the shipped H200 profile as host rate `compiled_kernel`, which
auditing/modes.py uses for compile mode's host side.

    python benchmarks/steps/fit_compile_host.py --write-profile \\
        --out benchmarks/results/steps-h200/compile_host_fit.json

Another GPU kind's runs (`--gpu h100`): every compile-mode loop under results/loops-<gpu>-*
and bench-<gpu> (its stage "as given", at the batch or input its command gave), written with
--write-profile into --profile (e.g. the H100 probe's under benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import gpushape  # noqa: E402
from gpushape.auditing.modes import compiled_kernels  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
PROFILE = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"
LLAMA = (
    "hf:llama?hidden_size=1024&intermediate_size=2816&num_hidden_layers=8"
    "&num_attention_heads=16&num_key_value_heads=4&vocab_size=32000"
)
LLAMA_LOOP = "loop-" + "".join("_" if c in ":/?&=" else c for c in LLAMA) + "-compile.json"
# (result file, variant or loop stage, model, batch or --input spec)
RUNS = (
    ("bench-h200/bert.json", "compile", "hf:bert", 32),
    ("bench-h200/bert-compile-graphs.json", "compile", "hf:bert", 32),
    ("bench-h200/bert-caller-backward.json", "compile", "hf:bert", 32),
    ("bench-h200/loop-hf_bert-compile.json", "as given", "hf:bert", 32),
    ("bench-h200/gpt2.json", "compile", "hf:gpt2", 8),
    ("bench-h200/gpt2-slow-host.json", "compile", "hf:gpt2", 8),
    ("bench-h200/gpt2-b16.json", "compile", "hf:gpt2", 16),
    ("bench-h200/gpt2-b16-compile.json", "compile", "hf:gpt2", 16),
    ("bench-h200/gpt2-b32.json", "compile", "hf:gpt2", 32),
    ("bench-h200/resnet50.json", "compile", "torchvision.models:resnet50",
     "256x3x224x224:bf16"),
    ("bench-h200/resnet50-slow-host.json", "compile", "torchvision.models:resnet50",
     "256x3x224x224:bf16"),
    ("bench-h200/resnet50-caller-backward.json", "compile", "torchvision.models:resnet50",
     "256x3x224x224:bf16"),
    ("bench-h200/loop-timm_mobilenetv3_large_100-compile.json", "as given",
     "timm:mobilenetv3_large_100", None),
    ("bench-h200/loop-timm_swin_tiny_patch4_window7_224-compile.json", "as given",
     "timm:swin_tiny_patch4_window7_224", None),
    # a later lease (2026-12-05, 05:10 UTC): its host issued MobileNetV3's compiled step in
    # 19.7 ms, where the first lease's took 37.3
    ("loops-h200-2/loop-timm_mobilenetv3_large_100-compile.json", "as given",
     "timm:mobilenetv3_large_100", None),
    ("loops-h200-2/loop-timm_efficientnet_b0-compile.json", "as given",
     "timm:efficientnet_b0", None),
    # a fourth lease (2026-12-05, 12:12 UTC) and a fifth (18:00-18:13 UTC)
    ("loops-h200-4/loop-timm_mobilenetv3_large_100-compile.json", "as given",
     "timm:mobilenetv3_large_100", None),
    ("loops-h200-4/loop-timm_efficientnet_b0-compile.json", "as given",
     "timm:efficientnet_b0", None),
    ("loops-h200-5/loop-timm_vit_base_patch16_224-compile.json", "as given",
     "timm:vit_base_patch16_224", None),
    ("loops-h200-5/loop-hf_gpt2-compile.json", "as given", "hf:gpt2", None),
    ("loops-h200-5/loop-timm_convnext_tiny-compile.json", "as given", "timm:convnext_tiny", None),
    ("loops-h200-5/loop-timm_swin_tiny_patch4_window7_224-compile.json", "as given",
     "timm:swin_tiny_patch4_window7_224", None),
    ("loops-h200-5/" + LLAMA_LOOP, "as given", LLAMA, None),
)  # fmt: skip


THROTTLED = (0.9, 1.1)  # issue / GPU busy in this band: the host may have waited on the GPU


def _stats(name: str, variant: str) -> dict:
    data = json.loads((RESULTS / name).read_text())
    if "stages" in data:
        return data["stages"][variant]
    return data["variants"][variant]


def discovered(gpu: str) -> tuple[tuple, ...]:
    """(result file, "as given", model, batch or --input spec) of every compile-mode loop
    committed for `gpu` (its command names the batch or input, else the model's default)."""
    runs = []
    for path in sorted(RESULTS.glob(f"loops-{gpu}-*/loop-*compile*.json")) + sorted(
        RESULTS.glob(f"bench-{gpu}/loop-*compile*.json")
    ):
        data = json.loads(path.read_text())
        if data.get("mode") != "compile" or "as given" not in data.get("stages", {}):
            continue
        words = shlex.split(data["environment"].get("command", ""))
        batch = None
        for flag, cast in (("--batch", int), ("--input", str)):
            if flag in words:
                batch = cast(words[words.index(flag) + 1])
        runs.append((str(path.relative_to(RESULTS)), "as given", data["model"], batch))
    return tuple(runs)


def kernels_of(model: str, batch, gpu: str = "h200-sxm") -> int:
    """The cost model's kernels of one training step of `model` (what the audit counts)."""
    if isinstance(batch, str):
        r = resolve_model(model, inputs=[batch])
    else:
        r = resolve_model(model, batch=batch)
    trace = gpushape.trace(r.model, r.example_inputs, train=True)
    return compiled_kernels(trace, gpushape.cost(trace, gpu))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--out", default=str(ROOT / "benchmarks/results/steps-h200/compile_host_fit.json")
    )
    p.add_argument("--write-profile", action="store_true")
    p.add_argument("--gpu", default="h200", help="whose runs: h200 (the list above) or another")
    p.add_argument("--profile", type=Path, default=PROFILE, help="the profile --write-profile sets")
    args = p.parse_args()
    runs = RUNS if args.gpu == "h200" else discovered(args.gpu)
    if not runs:
        raise SystemExit(f"no compile-mode loops under {RESULTS} for {args.gpu}")
    counted: dict[tuple, int] = {}
    rows = []
    for name, variant, model, batch in runs:
        key = (model, batch)
        if key not in counted:
            counted[key] = kernels_of(model, batch, f"{args.gpu}-sxm")
        s = _stats(name, variant)
        rows.append({
            "file": name,
            "variant": variant, "model": model,
            "batch": batch, "issue_s": s["issue_s"], "measured_kernels": s["kernels"],
            "predicted_kernels": counted[key], "per_kernel_s": s["issue_s"] / counted[key],
            "gpu_busy_s": s["gpu_busy_s"],
            "used": not THROTTLED[0] <= s["issue_s"] / s["gpu_busy_s"] <= THROTTLED[1],
        })  # fmt: skip
    used = [r for r in rows if r["used"]]
    rate = statistics.median(r["per_kernel_s"] for r in used)
    for r in rows:
        others = [o["per_kernel_s"] for o in used if o["model"] != r["model"]]
        left_out = statistics.median(others)
        r["predicted_over_measured"] = rate * r["predicted_kernels"] / r["issue_s"]
        r["left_out_over_measured"] = left_out * r["predicted_kernels"] / r["issue_s"]
    entry = {
        "seconds": rate,
        "workload": "host seconds per kernel of a torch.compile'd training step (the cost "
        "model's kernels): issue time of one step over its kernels, median over "
        f"{len(used)} runs ({len(counted)} models and batches) whose host did not wait on the "
        f"GPU, from benchmarks/results (bench-{args.gpu}, loops-{args.gpu}-*)",
        "calls": len(used),
    }
    write_results(args.out, {"rate": entry, "rows": rows})
    if args.write_profile:
        profile = json.loads(args.profile.read_text())
        profile.setdefault("host", {})["compiled_kernel"] = entry
        write_profile(profile, args.profile)
    print(f"compiled_kernel {rate * 1e6:.1f} us a kernel (median of {len(used)} runs)")
    print(f"{'file':52} {'kernels meas/pred':>18} {'issue ms':>9} {'GPU ms':>7} {'us/k':>6} "
          f"{'pred/meas':>9} {'left out':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['file']:52} {r['measured_kernels']:>8} / {r['predicted_kernels']:<7} "
            f"{r['issue_s'] * 1e3:9.1f} {r['gpu_busy_s'] * 1e3:7.1f} "
            f"{r['per_kernel_s'] * 1e6:6.1f} {r['predicted_over_measured']:9.2f} "
            f"{r['left_out_over_measured']:8.2f}{'' if r['used'] else '  (waited on the GPU)'}"
        )


if __name__ == "__main__":
    main()
