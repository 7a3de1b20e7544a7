"""What do host-side changes buy a host-bound eager step? An optimized BERT-MLM step on an H200
runs its kernels in ~29 ms but takes ~34 ms: the host issues it. Each set of transforms below is
a `gpushape.optimize` with exactly those transforms (the same numeric checks), timed against the
others in one process, blocks alternated (CUDA events over blocks of steps, median), with the
host's issue time of one step from an idle GPU; then the first set again with Python's garbage
collector frozen and off (rounds alternated with it on), since a large model's process holds
millions of Python objects that each full collection walks.

    python benchmarks/steps/host_fixes.py hf:bert --batch 32 --out $OUT/host_fixes.json \
        --sets "pad-channels,masked-lm-head;pad-channels,masked-lm-head,fuse-qkv"
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.models import resolve_model
from gpushape.steps import synthetic_batch
from gpushape.steps.measure import issue_time, time_blocks
from gpushape.steps.variants import Spec, build_variant


def _gc_rounds(run, rounds: int, block: int, cuda: bool) -> dict[str, list[float]]:
    """Seconds per step with the collector on and with it frozen and off, rounds alternated."""
    out: dict[str, list[float]] = {"gc on": [], "gc frozen": []}
    for _ in range(rounds):
        for name in out:
            if name == "gc frozen":
                gc.collect()
                gc.freeze()
                gc.disable()
            try:
                out[name] += time_blocks({name: run}, rounds=1, block=block, cuda=cuda)[name]
            finally:
                gc.enable()
                gc.unfreeze()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--batch", type=int)
    p.add_argument("--optimizer", default="adamw-fused")
    p.add_argument("--sets", required=True, help="transform sets, ';' between sets")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--out", default="host_fixes.json")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    args = p.parse_args()
    cuda = args.device == "cuda"
    resolved = resolve_model(args.model, batch=args.batch, dtype=torch.bfloat16, device=args.device)
    batch = synthetic_batch(resolved.model, resolved.example_inputs)
    specs = {"eager": Spec()}
    for s in args.sets.split(";"):
        names = tuple(t for t in s.split(",") if t)
        specs["+".join(names) or "optimize"] = Spec(optimize_mode="eager", transforms=names)
    runs, applied = {}, {}
    for name, spec in specs.items():
        variant = build_variant(name, resolved.model, batch, optimizer=args.optimizer, spec=spec)
        for _ in range(3):
            variant.run()
        runs[name] = variant.run
        report = variant.optimize_report
        applied[name] = sorted({c.transform for c in report.applied}) if report else []
    times = time_blocks(runs, rounds=args.rounds, block=args.block, cuda=cuda)
    issue = {name: issue_time(run, cuda=cuda) for name, run in runs.items()}
    first = next(n for n in specs if n != "eager")
    gc_times = _gc_rounds(runs[first], args.rounds, args.block, cuda)
    base = statistics.median(times["eager"])
    rows = {
        name: {
            "median_ms": statistics.median(t) * 1e3,
            "x_eager": base / statistics.median(t),
            "issue_ms": issue[name] * 1e3 if issue[name] is not None else None,
            "applied": applied[name],
            "step_times_ms": [x * 1e3 for x in t],
        }
        for name, t in times.items()
    }
    gc_rows = {k: statistics.median(v) * 1e3 for k, v in gc_times.items()}
    write_results(args.out, {"variants": rows, "gc": {"set": first, "median_ms": gc_rows}},
                  model=args.model, batch=args.batch)  # fmt: skip
    print(f"{'variant':70} {'ms':>8} {'x eager':>8} {'issue ms':>9}")
    for name, r in rows.items():
        print(f"{name[:70]:70} {r['median_ms']:8.2f} {r['x_eager']:8.3f} {r['issue_ms'] or 0:9.2f}")
    print(f"{first}: gc on {gc_rows['gc on']:.2f} ms, frozen and off {gc_rows['gc frozen']:.2f} ms")


if __name__ == "__main__":
    main()
