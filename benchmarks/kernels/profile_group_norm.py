"""Where gpushape's group-norm kernels spend a training step's GPU time, kernel by kernel.

    python benchmarks/kernels/profile_group_norm.py

GroupNormAct(G, C, activation="relu") forward + torch.autograd.grad of x, weight and bias, bf16,
at four shapes (ResNet-50-GN's 14x14 and 56x56 stages, PoolFormerV2's one-group norm at 7x7 and
56x56), 20 steps under torch.profiler after 5 of warm-up; prints each kernel's device time per
step in microseconds (sums, group, apply; the backward's parameter-gradient kernel is GRN's).
The sums and apply kernels each run once a direction, so their times are forward + backward.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.kernels import GroupNormAct

SHAPES = [
    ((64, 1024, 14, 14), 32),
    ((64, 256, 56, 56), 32),
    ((64, 512, 7, 7), 1),
    ((64, 64, 56, 56), 1),
]
STEPS = 20


def per_kernel_us(shape: tuple[int, ...], groups: int) -> dict[str, float]:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gn = nn.GroupNorm(groups, shape[1]).cuda().bfloat16()
    m = GroupNormAct.from_module(gn, "relu")
    dy = torch.randn_like(x)

    def step():
        torch.autograd.grad(m(x), (x, gn.weight, gn.bias), dy)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if t:
            out[e.key] = t / STEPS
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> None:
    if common.cuda_missing("cuda", "profile_group_norm.py"):
        sys.exit(2)
    for shape, groups in SHAPES:
        us = per_kernel_us(shape, groups)
        print(shape, groups, {k[:28]: round(v, 1) for k, v in us.items()})


if __name__ == "__main__":
    main()
