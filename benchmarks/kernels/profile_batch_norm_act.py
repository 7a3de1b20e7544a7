"""Where a batch_norm_act training step spends its time: GPU kernels (torch.profiler) against the
host's wall time per step, at ResNet-50's stage shapes (batch 256, bf16, channels_last).

    python benchmarks/kernels/profile_batch_norm_act.py [--out FILE.json] [--host]

For each shape and variant (eager BatchNorm2d + add + ReLU, gpushape's BatchNormAct2d):
the wall time of one fwd+bwd step with a synchronisation after it, the CUDA time of its kernels,
and each kernel's share. A step whose wall time is far above its kernel time is host-bound.
--host also runs gpushape's step at the smallest stage under cProfile and prints where the
host time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.kernels import BatchNormAct2d

SHAPES = [(256, 64, 112, 112), (256, 256, 56, 56), (256, 512, 28, 28), (256, 1024, 14, 14)]


def step_fn(variant, shape):
    c = shape[1]
    x = (
        torch.randn(shape, device="cuda")
        .to(torch.bfloat16)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_()
    )
    r = torch.randn_like(x).requires_grad_()
    dy = torch.randn_like(x)
    if variant == "eager":
        bn = nn.BatchNorm2d(c).cuda()

        def fn():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = F.relu(bn(x) + r)
            torch.autograd.grad(y, [x, r, bn.weight, bn.bias], dy)
    else:
        mod = BatchNormAct2d(c).cuda()

        def fn():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = mod(x, r)
            torch.autograd.grad(y, [x, r, mod.weight, mod.bias], dy)

    return fn


def measure(fn, steps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    walls.sort()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels[e.name].append(e.device_time)
    per_step = {k: sum(v) / 5 for k, v in kernels.items()}
    return walls[len(walls) // 2] * 1e6, per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--host", action="store_true", help="cProfile the host side too")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("profile_batch_norm_act: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for shape in SHAPES:
        for variant in ("eager", "gpushape"):
            wall_us, kernels = measure(step_fn(variant, shape))
            gpu_us = sum(kernels.values())
            rows.append(
                dict(
                    shape=list(shape),
                    variant=variant,
                    wall_us=wall_us,
                    kernel_us=gpu_us,
                    kernels=kernels,
                )
            )
            print(
                f"{'x'.join(map(str, shape)):17s} {variant:9s} wall {wall_us:8.1f} us/step, "
                f"kernels {gpu_us:8.1f} us/step",
                flush=True,
            )
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:6]:
                print(f"    {us:8.1f} us  {name[:110]}")
            torch.cuda.empty_cache()
    if args.host:
        fn = step_fn("gpushape", SHAPES[-1])
        measure(fn)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        profiler.disable()
        print(f"\nhost profile: 200 gpushape steps at {SHAPES[-1]}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    if args.out:
        write_results(
            args.out,
            rows,
            note="wall: median of 20 synchronised steps; kernels: "
            "CUDA time per step, torch.profiler over 5 steps",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
