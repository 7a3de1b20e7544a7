"""dropout_add_layer_norm against eager PyTorch and torch.compile of the same ops, on one GPU.

    python benchmarks/kernels/bench_dropout_add_norm.py [--shape 16384x768] [--p 0.1] [--sweep]

y = LayerNorm(dropout(x, p) + residual), bf16, BERT-base's block output at 32 x 512 tokens by
default. Each variant's forward, and its forward plus the gradients of x, residual, weight and
bias, is captured in a CUDA graph and timed by replays (GPU time alone), the variants
alternating round by round; gpushape's kernel also under other launch shapes (`CONFIG`).
GB/s counts the minimum bytes (S = one (M, N) tensor): forward 4 S (read x and residual, write
the sum and y), forward + backward 8 S (+ read dy and the sum, write two gradients); eager and
Inductor also write and read a mask. Writes $OUT/bench_dropout_add_norm.json; a table last.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common  # noqa: F401  (puts this working tree's src/ on the path)

from gpushape.bench import compare, write_results
from gpushape.bench.timer import cuda_graph
from gpushape.kernels.norms import dropout_add_layer_norm as dal

CONFIGS = {
    "default": dal.DropoutLaunch(),
    "sum 32x32": dal.DropoutLaunch(sum_block_n=32, sum_block_p=32),
    "sum 16x128": dal.DropoutLaunch(sum_block_n=16, sum_block_p=128),
    "bwd 4/sm": dal.DropoutLaunch(bwd_programs_per_sm=4),
}
# --sweep: forward launch shapes too (the forward ran at 0.45 of the H200's copy rate)
SWEEP = {
    "fwd 1 row, 4 warps": dal.DropoutLaunch(fwd_tile_elems=1024),
    "fwd 4 rows, 16 warps": dal.DropoutLaunch(fwd_tile_elems=4096),
    "fwd 2 rows, 4 warps": dal.DropoutLaunch(fwd_elems_per_thread=16),
    "fwd 2 rows, 16 warps": dal.DropoutLaunch(fwd_elems_per_thread=4),
}


def composition(x, r, w, b, p, eps=1e-12):
    return F.layer_norm(F.dropout(x, p, training=True) + r, x.shape[-1:], w, b, eps)


def ours(config):
    def fn(x, r, w, b, p, eps=1e-12):
        dal.CONFIG = config
        return dal.dropout_add_layer_norm(x, r, w, b, eps, p=p)

    return fn


def jobs(fn, tensors, p, dy):
    x, r, w, b = tensors

    def forward():
        with torch.no_grad():
            fn(x, r, w, b, p)

    def forward_backward():
        y = fn(x, r, w, b, p)
        torch.autograd.grad(y, (x, r, w, b), dy)

    return forward, forward_backward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="16384x768")
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--sweep", action="store_true", help="time other forward launch shapes too")
    args = ap.parse_args()
    configs = {**CONFIGS, **(SWEEP if args.sweep else {})}
    m, n = (int(v) for v in args.shape.split("x"))
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, n, device=dev, dtype=dt, requires_grad=True)
    r = torch.randn(m, n, device=dev, dtype=dt, requires_grad=True)
    w = (1 + 0.1 * torch.randn(n, device=dev)).to(dt).requires_grad_()
    b = (0.1 * torch.randn(n, device=dev)).to(dt).requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=dt)
    variants = {"eager": composition, "compiled": torch.compile(composition)}
    variants.update({f"gpushape {k}": ours(c) for k, c in configs.items()})
    timed = {}
    for kind in ("forward", "forward+backward"):
        graphs = {}
        for name, fn in variants.items():
            fwd, fwd_bwd = jobs(fn, (x, r, w, b), args.p, dy)
            graphs[name] = cuda_graph(fwd if kind == "forward" else fwd_bwd)
        timed[kind] = compare(graphs, rounds=args.rounds, repeats_per_round=20)
    dal.CONFIG = dal.DropoutLaunch()
    size = m * n * 2
    rows = []
    for name in variants:
        row = {"variant": name}
        for kind, passes in (("forward", 4), ("forward+backward", 8)):
            med = timed[kind][name].median_s
            row[f"{kind} us"] = med * 1e6
            row[f"{kind} GB/s"] = passes * size / med / 1e9
        rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_results(out / "bench_dropout_add_norm.json", rows, shape=[m, n], p=args.p,
                  configs={k: c._asdict() for k, c in configs.items()})  # fmt: skip
    print(f"dropout + add + LayerNorm, {m} x {n} bf16, p={args.p}, CUDA-graph replays, medians")
    print(f"{'variant':24} {'fwd us':>8} {'GB/s':>6} {'fwd+bwd us':>11} {'GB/s':>6}")
    for row in rows:
        fwd, both = "forward", "forward+backward"
        print(f"{row['variant']:24} {row[fwd + ' us']:8.1f} {row[fwd + ' GB/s']:6.0f} "
              f"{row[both + ' us']:11.1f} {row[both + ' GB/s']:6.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
