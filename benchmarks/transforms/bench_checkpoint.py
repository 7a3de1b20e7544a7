"""Selective activation checkpointing on GPT-2 against checkpointing every block.

Issue #16's line: with half of GPT-2's activation memory as the budget, gpushape's
`activation-checkpoint` must fit it (max_memory_allocated on the GPU) with less recompute time
than checkpointing every block. Three variants of the same model and batch, forward + backward
(no optimizer: its state is not activation memory), alternated in one process:
- `none`: as given;
- `every block`: transformers' own `gradient_checkpointing_enable()` (non-reentrant), every
  GPT2Block recomputed;
- `gpushape`: `optimize(memory_budget=...)` with only activation-checkpoint.
Activation memory is the step's peak allocation above what was allocated before it (weights
and their gradients held from the step before). The budget is half of `none`'s; the plan's
budget (what autograd keeps, which `saved_bytes` measures) is that less the step's transient
memory beyond what autograd keeps (`none`'s peak minus its saved bytes), so that the peak
fits. Recompute time is a variant's step time minus `none`'s.

    python benchmarks/transforms/bench_checkpoint.py --out $OUT/bench_checkpoint.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.models.library import hf_model
from gpushape.steps import synthetic_batch
from gpushape.transforms import optimize
from gpushape.transforms.activation_checkpoint import saved_bytes


def _step(model, batch):
    def run():
        model.zero_grad(set_to_none=False)
        batch.loss(model(*batch.inputs, **batch.kwargs)).backward()

    return run


def _peak_bytes(run, cuda: bool) -> int | None:
    """Peak allocation of one step above what was allocated before it (None on the CPU)."""
    if not cuda:
        return None
    run()  # gradients allocated: they are not activations
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _times(runs: dict, rounds: int, block: int, cuda: bool) -> dict[str, list[float]]:
    """Seconds per step of each run, blocks alternated."""
    import time

    out = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(block):
                run()
            if cuda:
                torch.cuda.synchronize()
            out[name].append((time.perf_counter() - t0) / block)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_checkpoint.json")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a 2-layer GPT-2, to check the script")
    args = p.parse_args()
    cuda = args.device == "cuda"
    size = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512} if args.tiny else {}
    model, inputs = hf_model("gpt2", batch=args.batch, seq=128 if args.tiny else None,
                             device=args.device, **size)  # fmt: skip
    model.train()
    batch = synthetic_batch(model, inputs)
    saved = saved_bytes(model, batch.inputs)
    peak = _peak_bytes(_step(model, batch), cuda)
    activations = peak if peak is not None else saved
    budget = activations // 2
    transient = max(activations - saved, 0)
    plan_budget = max(budget - transient, 0)

    every = copy.deepcopy(model)
    every.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ours, report = optimize(copy.deepcopy(model), batch.inputs, "h200", train=True,
                            transforms=["activation-checkpoint"], memory_budget=plan_budget,
                            verify_inputs=tuple(x[:2] for x in batch.inputs))  # fmt: skip
    variants = {"none": model, "every block": every, "gpushape": ours}
    runs = {name: _step(m, batch) for name, m in variants.items()}
    for run in runs.values():  # warm-up
        run()
    peaks = {name: _peak_bytes(run, cuda) for name, run in runs.items()}
    kept = {name: saved_bytes(m, batch.inputs) for name, m in variants.items()}
    times = _times(runs, args.rounds, 3 if args.tiny else 10, cuda)
    median = {name: statistics.median(t) for name, t in times.items()}
    rows = {
        name: {
            "step_ms": median[name] * 1e3,
            "recompute_ms": (median[name] - median["none"]) * 1e3,
            "peak_activation_bytes": peaks[name],
            "saved_bytes": kept[name],
            "fits_budget": (peaks[name] if peaks[name] is not None else kept[name]) <= budget,
            "step_times_ms": [t * 1e3 for t in times[name]],
        }
        for name in variants
    }
    checkpointed = [c.module for c in report.applied]
    results = {
        "batch": args.batch,
        "budget_bytes": budget,
        "plan_budget_bytes": plan_budget,
        "activation_bytes_as_given": activations,
        "checkpointed": checkpointed,
        "variants": rows,
        "holds": rows["gpushape"]["fits_budget"]
        and rows["gpushape"]["recompute_ms"] < rows["every block"]["recompute_ms"],
    }
    write_results(args.out, results)
    gb = 2**30
    print(f"budget {budget / gb:.2f} GiB (plan {plan_budget / gb:.2f}); {len(checkpointed)} "
          f"modules checkpointed by gpushape")  # fmt: skip
    print(f"{'variant':12} {'step ms':>8} {'recompute':>9} {'peak GiB':>9} {'fits':>5}")
    for name, r in rows.items():
        peak_gb = (r["peak_activation_bytes"] or r["saved_bytes"]) / gb
        print(f"{name:12} {r['step_ms']:8.2f} {r['recompute_ms']:9.2f} {peak_gb:9.2f} "
              f"{r['fits_budget']!s:>5}")  # fmt: skip
    print(f"holds: {results['holds']}")


if __name__ == "__main__":
    main()
