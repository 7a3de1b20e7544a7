"""Where the host's time goes in one eager forward+backward of the row norms, on one GPU.

    python benchmarks/kernels/profile_norms_host.py [--shapes 4096x16384,8192x8192] [--ops rms_norm]

For each (op, shape), bf16: the host's time to queue N steps without synchronising (`host_us`)
against the steps' wall time once the GPU is done (`wall_us`), for gpushape and for eager
PyTorch, then 200 gpushape steps under cProfile (top functions by own time). A step whose
host_us exceeds its GPU time is host-bound: the GPU idles between kernels.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.kernels import add_layer_norm, layer_norm_gelu, rms_norm


def _steps(op: str, shape, device="cuda"):
    n = shape[-1]
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.ones(n, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(n, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    ours = {
        "rms_norm": lambda: rms_norm(x, w),
        "layer_norm_gelu": lambda: layer_norm_gelu(x, w, b),
        "add_layer_norm": lambda: add_layer_norm(x, r, w, b)[0],
    }[op]
    eager = {
        "rms_norm": lambda: F.rms_norm(x, (n,), w),
        "layer_norm_gelu": lambda: F.gelu(F.layer_norm(x, (n,), w, b)),
        "add_layer_norm": lambda: F.layer_norm(x + r, (n,), w, b),
    }[op]
    inputs = (x, w) if op == "rms_norm" else (x, w, b) if op == "layer_norm_gelu" else (x, r, w, b)

    def step(fn):
        return lambda: torch.autograd.grad(fn(), inputs, dy)

    return step(ours), step(eager)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", type=common.parse_shapes, default=[(4096, 16384), (8192, 8192), (32768, 4096)]
    )
    parser.add_argument("--ops", default="rms_norm,layer_norm_gelu,add_layer_norm")
    args = parser.parse_args()
    if common.cuda_missing("cuda", "profile_norms_host.py"):
        sys.exit(2)
    for op in args.ops.split(","):
        for shape in args.shapes:
            ours, eager = _steps(op, shape)
            h, w = common.host_and_wall_us(ours)
            eh, ew = common.host_and_wall_us(eager)
            graph = common.graphed(ours, "cuda")
            _, gw = common.host_and_wall_us(graph)
            print(
                f"{op} {shape}: gpushape host {h:.0f} us, wall {w:.0f} us, graph {gw:.0f} us; "
                f"eager host {eh:.0f} us, wall {ew:.0f} us",
                flush=True,
            )
    op, shape = args.ops.split(",")[0], args.shapes[0]
    ours, _ = _steps(op, shape)
    common.host_and_wall_us(ours, warmup=5)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        ours()
    profiler.disable()
    torch.cuda.synchronize()
    print(f"\nhost profile: 200 gpushape {op} steps at {shape} (own time)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    print("by cumulative time:")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
