"""The compile mode's GPU side against compiled steps timed on the H200, on this machine.

For each committed run that compiled a model as given (a `gpushape bench` variant `compile`, or
the stage "as given" of a compile-mode loop), the model is rebuilt on the meta device at the
batch it ran and audited in compile mode; the predicted GPU time of the step is set beside the
GPU busy time torch.profiler measured (kernels, copies and memsets, one step). The eager
prediction is shown too: what Inductor's fusion is priced to save.

    python benchmarks/steps/check_compiled_gpu.py \\
        [--out benchmarks/results/steps-h200/compiled_gpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.auditing.api import audit  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
LLAMA = (
    "hf:llama?hidden_size=1024&intermediate_size=2816&num_hidden_layers=8"
    "&num_attention_heads=16&num_key_value_heads=4&vocab_size=32000"
)


def _stem(model: str) -> str:
    return "".join("_" if c in ":/?&=" else c for c in model)


# (result file, variant or loop stage, model, batch or --input spec)
RUNS = (
    ("loops-h200-5/loop-timm_vit_base_patch16_224-compile.json", "as given",
     "timm:vit_base_patch16_224", None),
    ("loops-h200-5/loop-hf_gpt2-compile.json", "as given", "hf:gpt2", None),
    ("loops-h200-5/loop-timm_convnext_tiny-compile.json", "as given", "timm:convnext_tiny", None),
    ("loops-h200-5/loop-timm_swin_tiny_patch4_window7_224-compile.json", "as given",
     "timm:swin_tiny_patch4_window7_224", None),
    (f"loops-h200-5/loop-{_stem(LLAMA)}-compile.json", "as given", LLAMA, None),
    ("loops-h200-4/loop-timm_mobilenetv3_large_100-compile.json", "as given",
     "timm:mobilenetv3_large_100", None),
    ("loops-h200-4/loop-timm_efficientnet_b0-compile.json", "as given",
     "timm:efficientnet_b0", None),
    ("bench-h200/gpt2-b32.json", "compile", "hf:gpt2", 32),
    ("bench-h200/resnet50.json", "compile", "torchvision.models:resnet50",
     "256x3x224x224:bf16"),
)  # fmt: skip


def _stats(name: str, variant: str) -> dict:
    data = json.loads((RESULTS / name).read_text())
    return data["stages"][variant] if "stages" in data else data["variants"][variant]


def predict(model: str, batch) -> dict[str, float]:
    if isinstance(batch, str):
        r = resolve_model(model, inputs=[batch])
    else:
        r = resolve_model(model, batch=batch)
    out = {}
    for mode in ("eager", "compile"):
        report = audit(r.model, r.example_inputs, "h200-sxm", train=True, mode=mode)
        out[mode] = report.step.gpu_s
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    print(f"{'model':36} {'batch':>20} {'measured':>9} {'compile':>8} {'ratio':>6} {'eager':>7}")
    for name, variant, model, batch in RUNS:
        s = _stats(name, variant)
        pred = predict(model, batch)
        row = {
            "file": name, "variant": variant, "model": model, "batch": batch,
            "measured_gpu_s": s["gpu_busy_s"], "predicted_compile_gpu_s": pred["compile"],
            "predicted_eager_gpu_s": pred["eager"],
            "predicted_over_measured": pred["compile"] / s["gpu_busy_s"],
        }  # fmt: skip
        rows.append(row)
        print(
            f"{model[:36]:36} {batch!s:>20} {s['gpu_busy_s'] * 1e3:9.2f} "
            f"{pred['compile'] * 1e3:8.2f} {row['predicted_over_measured']:6.2f} "
            f"{pred['eager'] * 1e3:7.2f}"
        )
    if args.out:
        write_results(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
