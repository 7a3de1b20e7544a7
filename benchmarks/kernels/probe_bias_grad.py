"""How fast can a Linear's bias gradient (the column sum of the output gradient) be on this GPU?

    python benchmarks/kernels/probe_bias_grad.py [--out bias_grad.json]

BERT-base's optimized training step spends ~2.4 ms of 28.6 in PyTorch's `reduce_kernel`, the
bias gradients of its Linears (`grad.sum(0)` over 16,384 rows in bf16). This times, on the
shapes BERT and GPT-2 give it, each way of taking that sum: PyTorch's `sum(0)`, a GEMV against
a vector of ones (cuBLAS) and torch.compile's reduction. Each is checked against an fp32
reference first. Two timings: "eager", calls back to back (the host's launch cost included where
it is the larger), and "graph", 20 calls replayed from one CUDA graph (GPU time alone: what a
graphed layer pays). GB/s counts the matrix read once; the copy rate is measured in the same
run. Variants alternate round by round (gpushape.bench.compare, CUDA events, medians).

The run committed on 2026-12-02 also timed a Triton column sum (banded fp32 partial sums and a
finishing pass, six launch tunings; commit 066762f). From a CUDA graph its best tuning took
1.1-1.5x the GEMV's time on the shapes up to 3,072 wide, so gpushape uses the GEMV
(transforms/_bias_grad.py) and the kernel was removed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import compare, copy_bandwidth_bytes_per_s, cuda_graph, write_results

SHAPES = [(16384, 768), (16384, 3072), (16384, 2304), (8192, 768), (8192, 3072), (2458, 30528)]
CALLS = 20  # per timed call of a graph


def _variants(g, ones, compiled) -> dict:
    return {
        "torch sum(0)": lambda: g.sum(0),
        "gemv ones": lambda: ones @ g,
        "compile sum(0)": lambda: compiled(g),
    }


def _graphed(fn):
    def many():
        for _ in range(CALLS):
            fn()

    return cuda_graph(many)


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
        eager = compare(variants, rounds=args.rounds, repeats_per_round=20)
        graphs = {name: _graphed(fn) for name, fn in variants.items()}
        graphed = compare(graphs, rounds=args.rounds, repeats_per_round=5)
        nbytes = m * n * 2
        for name in variants:
            gpu_s = graphed[name].median_s / CALLS
            rows.append(
                {
                    "shape": [m, n],
                    "variant": name,
                    "eager_us": eager[name].median_s * 1e6,
                    "graph_us": gpu_s * 1e6,
                    "graph_of_copy_rate": nbytes / gpu_s / copy_bps,
                    "max_rel_error": errors[name],
                }
            )
        del graphs
    write_results(args.out, rows, copy_gbps=copy_bps / 1e9, calls_per_graph=CALLS)
    print(f"copy rate {copy_bps / 1e9:,.0f} GB/s")
    print(
        f"{'shape':>11} {'variant':>22} {'eager us':>8} {'graph us':>8} {'of copy':>7} {'err':>7}"
    )
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        print(
            f"{shape:>11} {r['variant']:>22} {r['eager_us']:8.1f} {r['graph_us']:8.1f} "
            f"{r['graph_of_copy_rate']:7.2f} {r['max_rel_error']:7.1e}"
        )


if __name__ == "__main__":
    main()
