"""Why is torch.compile of Hugging Face's BERT MLM slower than eager on the H200? The top
kernels of one training step (forward and backward), eager against compiled, by device time.

    python benchmarks/steps/why_bert_compile.py --out $OUT/why_bert_compile.json
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.models.library import hf_model
from gpushape.steps import synthetic_batch


def top_kernels(step, n: int = 12) -> list[tuple[str, float]]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name[:100]] += e.device_time / 1e3
    return sorted(per.items(), key=lambda kv: -kv[1])[:n]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="why_bert_compile.json")
    args = p.parse_args()
    model, inputs = hf_model("bert", batch=32, device="cuda")
    batch = synthetic_batch(model, inputs)
    compiled = torch.compile(model)
    results = {}
    for name, fwd in (("eager", model), ("compile", compiled)):

        def step(fwd=fwd):
            model.zero_grad(set_to_none=True)
            batch.loss(fwd(*batch.inputs, **batch.kwargs)).backward()

        rows = top_kernels(step)
        results[name] = rows
        print(f"== {name}: total of top kernels {sum(t for _, t in rows):.2f} ms")
        for k, t in rows:
            print(f"{t:8.3f} ms  {k}")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
