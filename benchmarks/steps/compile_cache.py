"""Does a decoder trained without its key/value cache lose flash attention under torch.compile?

Run with use_cache=False and no padding mask, transformers checks the position ids for several
sequences packed into a row; while dynamo traces it cannot read them and builds the full causal
mask, so SDPA leaves flash (the audit's materialized-attention-mask says so, with no fix, and
tells the user to keep the cache). GPT-2 with and without its cache, the same weights, eager
and compiled, one training step each (fused AdamW), timed alternately in one process; the
attention kernels of each step from the profiler; and what the audit predicts for the compiled
step without the cache.

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
from gpushape.bench import compare, kernel_times, write_results
from gpushape.models import resolve_model

ATTENTION = ("flash", "fmha", "attention", "sdpa", "softmax")


def _step(model, ids):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=ids.is_cuda)

    def step():
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _predicted(spec: str, batch: int) -> dict:
    r = resolve_model(spec, batch=batch)
    report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True, mode="compile")
    found = [f for f in report.findings if f.rule == "materialized-attention-mask"]
    return {
        "step_gpu_ms": report.step.gpu_s * 1e3,
        "mask_saving_ms": found[0].est_saving_s * 1e3 if found else 0.0,
        "mask_fix": found[0].fix if found else None,
    }


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
    ids = r.example_inputs[0]
    steps = {}
    for name, model in (("cache", cached), ("no cache", uncached)):
        steps[f"eager, {name}"] = _step(model, ids)
        steps[f"compiled, {name}"] = _step(torch.compile(model), ids)
    for name, fn in steps.items():  # compile and warm each up before any timing
        print(f"warming up {name}", flush=True)
        for _ in range(3):
            fn()
    timings = compare(steps, rounds=args.rounds, repeats_per_round=5, warmup=1)
    rows = {}
    for name, fn in steps.items():
        kernels: dict[str, float] = {}  # name -> us a step, after all the timing
        for kernel, us in kernel_times(fn) if args.device == "cuda" else ():
            kernels[kernel] = kernels.get(kernel, 0.0) + us
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
                             "predicted_compile": predicted})  # fmt: skip
    print(f"{'variant':20} {'step ms':>8} {'GPU ms':>8} {'attention ms':>13}")
    for name, row in rows.items():
        att = sum(row["attention_kernels_ms"].values())
        print(f"{name:20} {row['median_ms']:8.2f} {row['gpu_ms']:8.2f} {att:13.2f}")
    saved = rows["compiled, no cache"]["median_ms"] - rows["compiled, cache"]["median_ms"]
    told = predicted["no cache"]
    print(
        f"compiled, keeping the cache saves {saved:.2f} ms a step; the audit predicts "
        f"{told['mask_saving_ms']:.2f} ms (fix: {told['mask_fix']})"
    )


if __name__ == "__main__":
    main()
