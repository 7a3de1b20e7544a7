"""Where FusedQKV's forward+backward time goes at LLaMA-7B's shapes, GEMM by GEMM, on one GPU.

    python benchmarks/kernels/probe_qkv_gemms.py [--out probe_qkv_gemms.json]

x (T=2048, E=4096) bf16, three projections of 4096 rows each (fused: one weight of 12288).
Every variant is replayed from a CUDA graph (GPU time alone), all alternated in one run
(`gpushape.bench.compare`); TFLOP/s from the GEMM FLOPs. Variants: the forward GEMM fused and
as three; dX = dY W as one GEMM (K = 12288), as three accumulated with addmm, and as autograd
runs three Linear layers (three mm and two adds); dW = dY^T X as one GEMM, as three into row
blocks, and transposed (X^T dY); the gradient assembly copies; the whole fwd+bwd of each
module, both with cuBLAS and with cuBLASLt preferred.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, kernel_times
from gpushape.bench.record import environment
from gpushape.kernels import FusedQKV

T, E, H = 2048, 4096, 32
D = E // H
GEMM = 2 * T * E * E  # one projection's FLOPs


def variants() -> dict[str, tuple[callable, float]]:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(T, E, device=dev, dtype=dt)
    w = torch.randn(3 * E, E, device=dev, dtype=dt) / 64
    ws = w.split(E)
    dy = torch.randn(T, 3 * E, device=dev, dtype=dt)
    dys = [torch.randn(T, E, device=dev, dtype=dt) for _ in range(3)]
    dx = torch.empty(T, E, device=dev, dtype=dt)
    dw = torch.empty(3 * E, E, device=dev, dtype=dt)
    dwt = torch.empty(E, 3 * E, device=dev, dtype=dt)
    bhtd = [torch.randn(1, H, T, D, device=dev, dtype=dt) for _ in range(3)]

    def dx_three_addmm():
        torch.mm(dys[0], ws[0], out=dx)
        torch.addmm(dx, dys[1], ws[1], out=dx)
        torch.addmm(dx, dys[2], ws[2], out=dx)

    def dw_three_blocks():
        for i, part in enumerate(dw.split(E)):
            torch.mm(dys[i].t(), x, out=part)

    out = {
        "fwd fused F.linear (N=12288)": (lambda: F.linear(x, w), 3 * GEMM),
        "fwd three F.linear": (lambda: [F.linear(x, wi) for wi in ws], 3 * GEMM),
        "dX one mm (K=12288)": (lambda: torch.mm(dy, w, out=dx), 3 * GEMM),
        "dX three mm + addmm accumulate": (dx_three_addmm, 3 * GEMM),
        "dX three mm + two adds (autograd)": (
            lambda: torch.mm(dys[0], ws[0]) + torch.mm(dys[1], ws[1]) + torch.mm(dys[2], ws[2]),
            3 * GEMM,
        ),
        "dW one mm dY^T X (M=12288)": (lambda: torch.mm(dy.t(), x, out=dw), 3 * GEMM),
        "dW three mm into row blocks": (dw_three_blocks, 3 * GEMM),
        "dW^T one mm X^T dY": (lambda: torch.mm(x.t(), dy, out=dwt), 3 * GEMM),
        "assemble dY from (B,H,T,D) grads (cat)": (
            lambda: torch.cat([g.transpose(1, 2).reshape(T, E) for g in bhtd], 1),
            0,
        ),
    }
    xg = torch.randn(1, T, E, device=dev, dtype=dt, requires_grad=True)
    fused = FusedQKV(E, H, bias=False, device=dev, dtype=dt)
    three = fused.to_linears()

    def three_run():
        return tuple(layer(xg).view(1, T, H, D).transpose(1, 2) for layer in three)

    grads = bhtd
    out["fwd+bwd FusedQKV"] = (
        lambda: torch.autograd.grad(fused(xg), [xg, fused.weight], grads),
        9 * GEMM,
    )
    out["fwd+bwd three Linear"] = (
        lambda: torch.autograd.grad(three_run(), [xg, *(lay.weight for lay in three)], grads),
        9 * GEMM,
    )
    return out


def kernels(fns: dict) -> dict[str, list[tuple[str, float]]]:
    """Each whole fwd+bwd's CUDA kernels in order, with their device time (us), from
    torch.profiler (the mean of 5 calls)."""
    return {
        name: [(k[:70], round(us, 1)) for k, us in kernel_times(fn, calls=5)]
        for name, (fn, _) in fns.items()
        if name.startswith("fwd+bwd")
    }


def run(label: str, rounds: int, repeats: int) -> list[dict]:
    fns = variants()
    graphs = {name: common.graphed(fn, "cuda") for name, (fn, _) in fns.items()}
    graphs = {name: g for name, g in graphs.items() if g is not None}
    timings = compare(graphs, rounds=rounds, repeats_per_round=repeats, warmup=3)
    rows = []
    for name, t in timings.items():
        flops = fns[name][1]
        rows.append(
            {
                "blas": label,
                "variant": name,
                "median_ms": t.median_s * 1e3,
                "tflops": flops / t.median_s / 1e12 if flops else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if common.cuda_missing("cuda", "probe_qkv_gemms.py"):
        sys.exit(2)
    listing = kernels(variants())
    for name, ks in listing.items():
        print(f"\n{name}: {len(ks)} kernels, {sum(t for _, t in ks):.1f} us")
        for kname, us in ks:
            print(f"  {us:8.1f} us  {kname}")
    rows = run("cublas", args.rounds, args.repeats)
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        rows += run("cublaslt", args.rounds, args.repeats)
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "env": environment(),
                    "command": " ".join(sys.argv),
                    "rows": rows,
                    "kernels": listing,
                },
                indent=1,
            )
        )
    print(f"\n{'blas':<9} {'variant':<42} {'ms':>8} {'TFLOP/s':>8}")
    for r in rows:
        tf = f"{r['tflops']:8.0f}" if r["tflops"] else f"{'-':>8}"
        print(f"{r['blas']:<9} {r['variant']:<42} {r['median_ms']:8.3f} {tf}")


if __name__ == "__main__":
    main()
