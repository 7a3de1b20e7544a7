"""Does padding the vocabulary still pay under torch.compile? The audit says Inductor pads
misaligned matmuls itself (pad-channels is info in compile mode); a measurement of 2026-11-30
(baselines-h200/compile_vocab_pad.json) saw BERT's padded vocabulary save 1.3 ms compiled.
For each model, the optimize-compile rewrite under torch.compile's reduce-overhead mode, with
and without pad-channels, timed alternately in one process.

    python benchmarks/steps/compile_pad.py --out $OUT/compile_pad.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.models.library import hf_model
from gpushape.steps import synthetic_batch
from gpushape.steps.run import measure_variants
from gpushape.steps.variants import Spec

CASES = {  # model -> (batch, the transforms optimize-compile applies there)
    "bert": (32, ("skip-attention-mask", "masked-lm-head")),
    "gpt2": (16, ("skip-attention-mask",)),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="compile_pad.json")
    p.add_argument("--models", default="bert,gpt2")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 1-layer model, to check the script")
    args = p.parse_args()
    tiny = dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=128)
    results = {}
    for name in args.models.split(","):
        batch_size, fixes = CASES[name]
        size = (
            (tiny if name == "bert" else {"n_layer": 1, "n_embd": 64, "n_head": 2})
            if args.tiny
            else {}
        )
        model, inputs = hf_model(
            name,
            batch=2 if args.tiny else batch_size,
            seq=64 if args.tiny else None,
            device=args.device,
            **size,
        )
        batch = synthetic_batch(model, inputs)
        specs = {
            "eager": Spec(),
            "compiled": Spec(optimize_mode="compile", transforms=fixes, runner="compile-graphs"),
            "compiled, padded": Spec(
                optimize_mode="compile",
                transforms=("pad-channels", *fixes),
                runner="compile-graphs",
            ),
        }
        built, stats, failed = measure_variants(
            specs, model, batch, optimizer="adamw-fused", gpu="h200", rounds=args.rounds,
            block=10, warmup=3, progress=print,
        )  # fmt: skip
        rows = {}
        for variant, s in stats.items():
            rows[variant] = {
                "median_ms": statistics.median(s.step_times_s) * 1e3,
                "step_times_ms": [t * 1e3 for t in s.step_times_s],
                "gpu_busy_ms": (s.gpu_busy_s or 0) * 1e3,
                "kernels": s.kernels,
                "applied": sorted({c.transform for c in built[variant].optimize_report.applied})
                if built[variant].optimize_report
                else [],
            }
        results[name] = {"batch": batch_size, "variants": rows, "failed": failed}
        del model, built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_results(args.out, results)
    print(f"{'model':6} {'variant':18} {'step ms':>8} {'GPU ms':>8}")
    for name, r in results.items():
        for variant, row in r["variants"].items():
            print(f"{name:6} {variant:18} {row['median_ms']:8.2f} {row['gpu_busy_ms']:8.2f}")
        for variant, why in r["failed"].items():
            print(f"{name:6} {variant:18} failed: {why}")


if __name__ == "__main__":
    main()
