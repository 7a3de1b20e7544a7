"""Is graph-layers' self-check stable? optimize() built several times on one model, in one process.

    python benchmarks/transforms/diagnose_graph_check.py hf:bert --batch 32 --builds 3 \
        --out $OUT/diagnose_graph_check.json

Each build is what `gpushape bench --vs optimize` builds (a deep copy, optimize in eager mode,
fused AdamW). For each it records whether graph-layers was kept or why it was refused, the
step's median time (CUDA events, 20 steps after 5), and, where the layers are graphed, the
self-check run again three times, and the model run eagerly twice from one seed (is the eager
model itself deterministic?), with the largest differences of outputs and gradients.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import time_fn, write_results
from gpushape.models import resolve_model
from gpushape.steps import synthetic_batch
from gpushape.steps.variants import build_variant
from gpushape.transforms import _graph_check
from gpushape.transforms.graph_layers import is_graphed


def _twice(model, inputs, bypass_second: bool) -> dict:
    """The model run twice from seed 1234: eager (graphs bypassed), then graphed or eager."""
    state = torch.cuda.get_rng_state()
    try:
        _graph_check.Bypass.on = True
        torch.cuda.manual_seed(1234)
        ref_out, ref_grads, weights = _graph_check._loss_and_grads(model, inputs, None)
        _graph_check.Bypass.on = bypass_second
        torch.cuda.manual_seed(1234)
        out, grads, _ = _graph_check._loss_and_grads(model, inputs, weights)
    finally:
        _graph_check.Bypass.on = False
        torch.cuda.set_rng_state(state)

    def worst(pairs):
        best = (0.0, 0.0, -1)
        for i, (a, b) in enumerate(pairs):
            if a is None or b is None:
                continue
            err = (a.float() - b.float()).abs().max().item()
            scale = b.float().abs().max().item()
            if scale and err / scale > best[0]:
                best = (err / scale, err, i)
        return {"relative": best[0], "absolute": best[1], "index": best[2]}

    return {"outputs": worst(zip(out, ref_out)), "gradients": worst(zip(grads, ref_grads))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="hf:bert")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--builds", type=int, default=3)
    p.add_argument("--optimizer", default="adamw-fused")
    p.add_argument("--out", default="diagnose_graph_check.json")
    args = p.parse_args()
    resolved = resolve_model(args.model, batch=args.batch, dtype=torch.bfloat16, device="cuda")
    batch = synthetic_batch(resolved.model, resolved.example_inputs)
    rows = []
    for i in range(args.builds):
        variant = build_variant("optimize", resolved.model, batch, optimizer=args.optimizer)
        model = variant.step.model
        report = variant.optimize_report
        refused = [r.reason for r in report.refused if r.transform == "graph-layers"]
        graphed = any(is_graphed(m) for m in model.modules())
        timing = time_fn(variant.run, warmup=5, repeats=20)
        row = {
            "build": i,
            "graph_layers": "kept" if graphed else "refused",
            "refused": refused,
            "measured_s": report.measured.get("graph-layers"),
            "step_ms": timing.median_s * 1e3,
            "step_p90_ms": timing.p90_s * 1e3,
        }
        if graphed:
            row["rechecks"] = [_graph_check.self_check(model, batch.inputs) for _ in range(3)]
            row["graphed_vs_eager"] = _twice(model, batch.inputs, bypass_second=False)
        row["eager_vs_eager"] = _twice(model, batch.inputs, bypass_second=True)
        rows.append(row)
        print(row, flush=True)
        del variant, model, report
        gc.collect()
    write_results(args.out, rows, model=args.model, batch=args.batch)
    print(f"{'build':>5} {'graph-layers':>12} {'step ms':>8} {'p90':>7}  refused / rechecks")
    for r in rows:
        print(
            f"{r['build']:>5} {r['graph_layers']:>12} {r['step_ms']:8.2f} {r['step_p90_ms']:7.2f}"
            f"  {r['refused'] or r.get('rechecks')}"
        )


if __name__ == "__main__":
    main()
