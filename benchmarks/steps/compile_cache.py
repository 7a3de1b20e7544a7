"""What the key/value cache costs a decoder's training step, and what dropping it costs.

transformers' decoders fill their cache in training forwards too (use_cache=True, the default:
the audit's kv-cache-in-training). Run with use_cache=False and no padding mask, transformers
checks the position ids for several sequences packed into a row; while dynamo traces it cannot
read them and builds the full causal mask, so SDPA leaves flash (materialized-attention-mask).
gpushape's no-kv-cache drops the cache and answers that check as the model's own positions
are. GPT-2, the same weights: with the cache, with use_cache=False, and with no-kv-cache, eager
and compiled, one training step each (fused AdamW), timed alternately in one process; the
attention kernels of each step from the profiler; and the savings the audit predicts.

    python benchmarks/steps/compile_cache.py --out $OUT/compile_cache.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import gpushape
from gpushape.bench import compare, kernel_totals, write_results
from gpushape.models import resolve_model

ATTENTION = ("flash", "fmha", "attention", "sdpa", "softmax")
RULES = ("kv-cache-in-training", "materialized-attention-mask")


def _step(model, ids):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=ids.is_cuda)

    def step():
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _predicted(spec: str, batch: int) -> dict:
    """Per mode: the step's GPU work, and the GPU and wall-clock savings of each finding about
    the cache or the mask."""
    r = resolve_model(spec, batch=batch)
    out = {}
    for mode in ("eager", "compile"):
        report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True, mode=mode)
        found = {f.rule: f for f in report.findings if f.rule in RULES}
        out[mode] = {
            "step_gpu_ms": report.step.gpu_s * 1e3,
            **{f"{rule}_ms": (f.est_saving_s or 0.0) * 1e3 for rule, f in found.items()},
            **{
                f"{rule}_wall_ms": f.evidence.get("wall_saving_s", 0.0) * 1e3
                for rule, f in found.items()
            },
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="compile_cache.json")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 1-layer GPT-2, to check the script")
    args = p.parse_args()
    small = "?n_layer=1&n_embd=64&n_head=2&vocab_size=512&n_positions=64" if args.tiny else ""
    spec = f"hf:gpt2{small}"
    r = resolve_model(spec, batch=args.batch, device=args.device)
    cached = r.model.train()
    uncached = copy.deepcopy(cached)
    uncached.config.use_cache = False
    fixed, _ = gpushape.optimize(
        copy.deepcopy(cached), r.example_inputs, gpu="h200", transforms=["no-kv-cache"]
    )
    ids = r.example_inputs[0]
    steps = {}
    for name, model in (("cache", cached), ("no cache", uncached), ("no-kv-cache", fixed)):
        steps[f"eager, {name}"] = _step(model, ids)
        steps[f"compiled, {name}"] = _step(torch.compile(model), ids)
    for name, fn in steps.items():  # compile and warm each up before any timing
        print(f"warming up {name}", flush=True)
        for _ in range(3):
            fn()
    timings = compare(steps, rounds=args.rounds, repeats_per_round=5, warmup=1)
    rows = {}
    for name, fn in steps.items():
        kernels = kernel_totals(fn) if args.device == "cuda" else {}  # after all the timing
        attention = {k: v for k, v in kernels.items() if any(w in k.lower() for w in ATTENTION)}
        rows[name] = {
            "median_ms": statistics.median(timings[name].times_s) * 1e3,
            "times_ms": [t * 1e3 for t in timings[name].times_s],
            "gpu_ms": sum(kernels.values()) / 1e3,
            "attention_kernels_ms": {k: v / 1e3 for k, v in attention.items()},
        }
    predicted = {
        "cache": _predicted(spec, args.batch),
        "no cache": _predicted(f"{spec}{'&' if small else '?'}use_cache=False", args.batch),
    }
    write_results(args.out, {"model": spec, "batch": args.batch, "rows": rows,
                             "predicted": predicted})  # fmt: skip
    print(f"{'variant':24} {'step ms':>8} {'GPU ms':>8} {'attention ms':>13}")
    for name, row in rows.items():
        att = sum(row["attention_kernels_ms"].values())
        print(f"{name:24} {row['median_ms']:8.2f} {row['gpu_ms']:8.2f} {att:13.2f}")
    for mode in ("eager", "compiled"):
        base = rows[f"{mode}, cache"]["median_ms"]
        told = predicted["cache"]["compile" if mode == "compiled" else "eager"]
        print(
            f"{mode}: no-kv-cache saves {base - rows[f'{mode}, no-kv-cache']['median_ms']:.2f} "
            f"ms (predicted {told.get('kv-cache-in-training_wall_ms', 0.0):.2f}); use_cache=False "
            f"costs {rows[f'{mode}, no cache']['median_ms'] - base:.2f} ms"
        )


if __name__ == "__main__":
    main()
