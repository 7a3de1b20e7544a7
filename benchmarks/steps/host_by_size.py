"""Does the host's cost of an op grow with its size? gpushape's host model prices each op's
dispatch and launch by its kind only (`gpushape probe`'s host rates, taken on small tensors),
but an eager BERT step issues in 21 ms at batch 2 and in 38 ms at batch 16 (H200,
`host_validate.json`). Here each op of a BERT layer is issued 100 times back to back (no sync
between; the GPU is idle at the start and the queue never fills) at a small and at a large row
count, and the host's seconds per call are reported: forward alone, and forward with backward.
Linear layers run both ways PyTorch can: addmm with the bias fused (cuBLASLt) and, with
`DISABLE_ADDMM_CUDA_LT=1` in a child process, cuBLAS with the bias added.

    python benchmarks/steps/host_by_size.py --out $OUT/host_by_size.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

CALLS = 100
REPEATS = 7


def host_seconds(fn, calls: int = CALLS, repeats: int = REPEATS) -> float:
    """Median host seconds per call of `fn`, issued `calls` times from an idle GPU."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return statistics.median(times)


def ops(rows: int) -> dict:
    dev, dt = "cuda", torch.bfloat16
    h, ff, vocab, heads = 768, 3072, 30528, 12
    x = torch.randn(rows, h, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(h, h, device=dev, dtype=dt, requires_grad=True)
    w_up = torch.randn(ff, h, device=dev, dtype=dt, requires_grad=True)
    w_voc = torch.randn(vocab, h, device=dev, dtype=dt, requires_grad=True)
    b, b_up = (torch.zeros(n, device=dev, dtype=dt, requires_grad=True) for n in (h, ff))
    ln_w, ln_b = torch.ones(h, device=dev, dtype=dt), torch.zeros(h, device=dev, dtype=dt)
    seq = 512 if rows >= 512 else rows
    q = torch.randn(rows // seq, heads, seq, h // heads, device=dev, dtype=dt, requires_grad=True)
    g = torch.randn(rows, h, device=dev, dtype=dt)
    g_up = torch.randn(rows, ff, device=dev, dtype=dt)

    def fwd_bwd(f, grad):
        def run():
            f().backward(grad)

        return run

    with torch.no_grad():
        forward = {
            "linear 768->768 bias": host_seconds(lambda: F.linear(x, w, b)),
            "linear 768->768": host_seconds(lambda: F.linear(x, w)),
            "linear 768->3072 bias": host_seconds(lambda: F.linear(x, w_up, b_up)),
            "linear 768->30528": host_seconds(lambda: F.linear(x, w_voc), calls=20),
            "layer_norm": host_seconds(lambda: F.layer_norm(x, (h,), ln_w, ln_b)),
            "add": host_seconds(lambda: x + x),
            "gelu": host_seconds(lambda: F.gelu(x)),
            "sdpa": host_seconds(lambda: F.scaled_dot_product_attention(q, q, q)),
        }
    backward = {
        "linear 768->768 bias": host_seconds(fwd_bwd(lambda: F.linear(x, w, b), g)),
        "linear 768->3072 bias": host_seconds(fwd_bwd(lambda: F.linear(x, w_up, b_up), g_up)),
        "layer_norm": host_seconds(fwd_bwd(lambda: F.layer_norm(x, (h,), ln_w, ln_b), g)),
        "sdpa": host_seconds(fwd_bwd(lambda: F.scaled_dot_product_attention(q, q, q), q.detach())),
    }
    return {"forward": forward, "forward+backward": backward}


def norm_chain(rows: int, sites: int = 24) -> dict:
    """Host seconds per site of `sites` residual-add + LayerNorm sites in a chain, forward and
    forward with one backward for the chain: PyTorch's add and layer_norm against gpushape's
    AddLayerNorm (what fuse-norm-act puts in a BERT layer)."""
    from gpushape.kernels import AddLayerNorm

    h, dev, dt = 768, "cuda", torch.bfloat16
    x = torch.randn(rows, h, device=dev, dtype=dt, requires_grad=True)
    natives = [torch.nn.LayerNorm(h, device=dev, dtype=dt) for _ in range(sites)]
    fused = [AddLayerNorm(h, device=dev, dtype=dt) for _ in range(sites)]

    def native():
        y = x
        for ln in natives:
            y = ln(y + x)
        return y

    def gpushape():
        y = x
        for ln in fused:
            y, _ = ln(y, x)
        return y

    out = {}
    for name, chain in (("add + layer_norm", native), ("AddLayerNorm", gpushape)):
        with torch.no_grad():
            fwd = host_seconds(chain, calls=5)
        both = host_seconds(lambda chain=chain: chain().sum().backward(), calls=5)
        out[name] = {"forward": fwd / sites, "forward+backward": both / sites}
    return out


def measure(sizes: list[int]) -> dict:
    return {str(m): {**ops(m), "norm chain": norm_chain(m)} for m in sizes}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1024,16384")
    p.add_argument("--out", default="host_by_size.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(measure(sizes)))
        return
    from gpushape.bench import write_results

    results = {"cublaslt": measure(sizes)}
    env = {**os.environ, "DISABLE_ADDMM_CUDA_LT": "1"}
    child = subprocess.run(
        [sys.executable, __file__, "--child", "--sizes", args.sizes],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    results["cublas (DISABLE_ADDMM_CUDA_LT=1)"] = json.loads(child.stdout.strip().splitlines()[-1])
    write_results(args.out, results, calls=CALLS, repeats=REPEATS)
    print(f"{'path':34} {'op':24} " + " ".join(f"{'rows ' + str(m):>12}" for m in sizes))
    for path, by_size in results.items():
        for part in ("forward", "forward+backward"):
            for op in by_size[str(sizes[0])][part]:
                cells = " ".join(f"{by_size[str(m)][part][op] * 1e6:10.1f}us" for m in sizes)
                print(f"{path[:34]:34} {(part[:3] + ' ' + op)[:24]:24} {cells}")
        for name in by_size[str(sizes[0])]["norm chain"]:
            for part in ("forward", "forward+backward"):
                cells = " ".join(
                    f"{by_size[str(m)]['norm chain'][name][part] * 1e6:10.1f}us" for m in sizes
                )
                print(f"{path[:34]:34} {(part[:3] + ' site ' + name)[:24]:24} {cells}")


if __name__ == "__main__":
    main()
