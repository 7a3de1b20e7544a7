"""How fast can a Linear's bias gradient (the column sum of the output gradient) be on this GPU?

    python benchmarks/kernels/probe_bias_grad.py [--out bias_grad.json]

BERT-base's optimized training step spends ~2.4 ms of 28.6 in PyTorch's `reduce_kernel`, the
bias gradients of its 74 Linears (`grad.sum(0)` over 16,384 rows in bf16). This times, on the
shapes BERT and GPT-2 give it, each way of taking that sum: PyTorch's `sum(0)`, a GEMV against
a vector of ones (cuBLAS), torch.compile's reduction, and gpushape's Triton column sum. It checks
each against an fp32 reference first, and reports GB/s against the copy rate measured in the
same run. Variants alternate round by round (gpushape.bench.compare, CUDA events, medians).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import compare, copy_bandwidth_bytes_per_s, write_results
from gpushape.kernels.linear.column_sum import column_sum

SHAPES = [(16384, 768), (16384, 3072), (16384, 2304), (8192, 768), (8192, 3072), (2458, 30528)]


def _variants(g, ones, compiled) -> dict:
    return {
        "torch sum(0)": lambda: g.sum(0),
        "gemv ones": lambda: ones @ g,
        "compile sum(0)": lambda: compiled(g),
        "gpushape column_sum": lambda: column_sum(g),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bias_grad.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    copy_bps = copy_bandwidth_bytes_per_s()
    rows = []
    for m, n in SHAPES:
        g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        ones = torch.ones(m, device="cuda", dtype=torch.bfloat16)
        variants = _variants(g, ones, torch.compile(lambda t: t.sum(0), dynamic=False))
        ref = g.float().sum(0)
        errors = {}
        for name, fn in variants.items():
            out = fn().float()
            errors[name] = float((out - ref).abs().max() / ref.abs().max())
        timings = compare(variants, rounds=args.rounds, repeats_per_round=20)
        nbytes = m * n * 2 + n * 2
        for name, t in timings.items():
            rows.append(
                {
                    "shape": [m, n],
                    "variant": name,
                    "median_us": t.median_s * 1e6,
                    "gbps": nbytes / t.median_s / 1e9,
                    "of_copy_rate": nbytes / t.median_s / copy_bps,
                    "max_rel_error": errors[name],
                }
            )
    write_results(args.out, rows, copy_gbps=copy_bps / 1e9)
    print(f"copy rate {copy_bps / 1e9:,.0f} GB/s")
    print(f"{'shape':>14} {'variant':>22} {'us':>8} {'GB/s':>7} {'of copy':>7} {'rel err':>8}")
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        print(
            f"{shape:>14} {r['variant']:>22} {r['median_us']:8.1f} {r['gbps']:7.0f} "
            f"{r['of_copy_rate']:7.2f} {r['max_rel_error']:8.1e}"
        )


if __name__ == "__main__":
    main()
