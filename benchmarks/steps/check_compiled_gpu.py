"""The compile mode's GPU side against compiled steps timed on the H200, on this machine.

For each committed run that compiled a model as given (a `gpushape bench` variant `compile`, or
the stage "as given" of a compile-mode loop), the model is rebuilt on the meta device at the
batch it ran and audited in compile mode; the predicted GPU time of the step is set beside the
GPU busy time torch.profiler measured (kernels, copies and memsets, one step). The eager
prediction is shown too: what Inductor's fusion is priced to save. Each model is audited with
the optimizer its run stepped (the run's `--optimizer`, else bench's default), whose GPU work
the measured step holds too. Hugging Face models are
audited as the runs' transformers (5.17) built them under torch.compile: with an all-true
attention mask, whose cost is in the compiled step (`materialized-attention-mask`).

    python benchmarks/steps/check_compiled_gpu.py \\
        [--out benchmarks/results/steps-h200/compiled_gpu.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.auditing.api import audit  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.steps.batch import synthetic_batch  # noqa: E402
from gpushape.steps.step import make_optimizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_compile_host import LLAMA_LOOP, RESULTS, _stats  # noqa: E402
from fit_compile_host import RUNS as HOST_RUNS  # noqa: E402

# of the compiled steps fit_compile_host.py reads, one per model and batch: the newest lease's
# where it ran the model, each step as given (a loop's stage "as given", a bench's `compile`)
CHECKED = (
    "loops-h200-5/loop-timm_vit_base_patch16_224-compile.json",
    "loops-h200-5/loop-hf_gpt2-compile.json",
    "loops-h200-5/loop-timm_convnext_tiny-compile.json",
    "loops-h200-5/loop-timm_swin_tiny_patch4_window7_224-compile.json",
    "loops-h200-5/" + LLAMA_LOOP,
    "loops-h200-4/loop-timm_mobilenetv3_large_100-compile.json",
    "loops-h200-4/loop-timm_efficientnet_b0-compile.json",
    "bench-h200/gpt2-b32.json",
    "bench-h200/resnet50.json",
)
RUNS = tuple(run for name in CHECKED for run in HOST_RUNS if run[0] == name)


def _as_the_run_had_it(model: str):
    """The GPU runs' transformers (5.17) built an all-true attention mask while compiling, which
    later releases do not: a Hugging Face model is audited with that release's behaviour
    emulated (tests/_hf_masks.py), so its compiled step carries the mask's cost as it ran."""
    import contextlib

    if not model.startswith("hf:"):
        return contextlib.nullcontext()
    sys.path.insert(0, str(ROOT / "tests"))
    from _hf_masks import old_masks

    return old_masks()


def _optimizer_of(name: str) -> str:
    """The run's `--optimizer` (bench's default "auto" where it named none)."""
    words = shlex.split(json.loads((RESULTS / name).read_text())["environment"]["command"])
    return words[words.index("--optimizer") + 1] if "--optimizer" in words else "auto"


def predict(model: str, batch, optimizer: str = "auto") -> dict[str, float]:
    if isinstance(batch, str):
        r = resolve_model(model, inputs=[batch])
    else:
        r = resolve_model(model, batch=batch)
    out = {}
    with _as_the_run_had_it(model):
        step = make_optimizer(r.model, synthetic_batch(r.model, r.example_inputs), optimizer)
        for mode in ("eager", "compile"):
            report = audit(r.model, r.example_inputs, "h200-sxm", train=True, mode=mode,
                           optimizer=step)  # fmt: skip
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
        pred = predict(model, batch, _optimizer_of(name))
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
