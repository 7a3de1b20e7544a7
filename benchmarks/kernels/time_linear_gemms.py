"""Time the three GEMMs of a 768-wide Linear layer (BERT-base's, GPT-2's) at several row counts
and output widths, on one GPU: the forward (with bias), dX = dY W and dW = dY^T X, bf16.

    python benchmarks/kernels/time_linear_gemms.py --out time_linear_gemms.json
    python benchmarks/kernels/time_linear_gemms.py --compare time_linear_gemms.json \
        --profile benchmarks/results/probe-h100/h100-sxm.json     # on any machine

The second prints each GEMM's measured time beside the cost model's (`tracing/gemm_model.py`,
its FLOPs at the profile's rate x the model's efficiency, plus the kernel latency).

Written to see why fuse-qkv saves BERT (batch 32 x 512 = 16384 rows) more than the cost model
says: output widths 768 (one projection), 1536, 2304 (query, key and value fused) and 3072 (the
MLP), rows 4096 to 32768. A 8192^3 GEMM runs 200 times first, to bring the clocks up; then each
GEMM runs 5 times, and 30 times 20 back-to-back calls between two CUDA events (20 calls, so the
GPU does not wait on the host's launches); the median of the 30, over 20. Random data, timed
in a tight loop, runs the GPU near its power limit: the rates are below what the same GEMMs get
inside a training step, so compare the shapes with each other. Two repetitions of the whole
sweep; the second is the one to read (`rep` 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from gpushape.bench import write_results

ROWS = (4096, 8192, 16384, 32768)
WIDTHS = (768, 1536, 2304, 3072)
K = 768
CALLS = 20  # calls between two events
SAMPLES = 30


def median_us(fn) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(SAMPLES)
    ]
    for start, end in events:
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    return times[SAMPLES // 2] * 1e3 / CALLS


def compare(path: str, profile: str) -> None:
    import json

    from gpushape.hardware.profile import load_profile
    from gpushape.tracing.flops.registry import Gemm
    from gpushape.tracing.gemm_model import gemm_efficiency

    gpu = load_profile(profile)
    rate, latency = gpu.attainable_flops("bf16"), gpu.achievable.gemm_latency_s
    rows = [r for r in json.loads(Path(path).read_text())["results"] if r["rep"] == 1]
    print("measured / modelled us (ratio modelled over measured)")
    print(f"{'rows':>6} {'n':>5} {'forward':>20} {'dX':>20} {'dW':>20}")
    for r in rows:
        m, n = r["rows"], r["n"]
        cells = []
        for key, (a, b, c) in (("fwd", (m, n, K)), ("dgrad", (m, K, n)), ("wgrad", (n, K, m))):
            gemm = Gemm(m=a, n=b, k=c, flops=2 * a * b * c)
            model = gemm.flops / (rate * gemm_efficiency(gemm, gpu, "bf16").efficiency)
            model = (model + latency) * 1e6
            cells.append(f"{r[key + '_us']:6.1f} / {model:6.1f} ({model / r[key + '_us']:.2f})")
        print(f"{m:>6} {n:>5} " + " ".join(f"{c:>20}" for c in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="time_linear_gemms.json")
    p.add_argument("--compare", metavar="RESULT", help="print RESULT beside the cost model")
    p.add_argument("--profile", help="the GPU profile --compare prices with")
    args = p.parse_args()
    if args.compare:
        if not args.profile:
            sys.exit("time_linear_gemms.py: --compare needs --profile")
        return compare(args.compare, args.profile)
    if not torch.cuda.is_available():
        sys.exit("time_linear_gemms.py: needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    bf16 = torch.bfloat16
    warm = torch.randn(8192, 8192, device="cuda", dtype=bf16)
    for _ in range(200):
        warm @ warm
    torch.cuda.synchronize()
    rows = []
    for rep in range(2):
        for m in ROWS:
            for n in WIDTHS:
                x = torch.randn(m, K, device="cuda", dtype=bf16)
                w = torch.randn(n, K, device="cuda", dtype=bf16)
                b = torch.randn(n, device="cuda", dtype=bf16)
                g = torch.randn(m, n, device="cuda", dtype=bf16)
                row = dict(
                    rep=rep,
                    rows=m,
                    n=n,
                    k=K,
                    fwd_us=median_us(lambda x=x, w=w, b=b: F.linear(x, w, b)),
                    dgrad_us=median_us(lambda g=g, w=w: g @ w),
                    wgrad_us=median_us(lambda g=g, x=x: g.t() @ x),
                )
                rows.append(row)
                print(row)
    write_results(args.out, rows)


if __name__ == "__main__":
    main()
