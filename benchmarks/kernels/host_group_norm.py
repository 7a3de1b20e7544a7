"""What an eager GroupNorm (+ ReLU) costs the host, PyTorch's against gpushape's, on one GPU.

    python benchmarks/kernels/host_group_norm.py [--calls 1000] [--out host_group_norm.json]

Tiny shapes (2 x 32 x 4 x 4: the GPU finishes each kernel in a few microseconds), so a call's
time is the host's. Times, microseconds per call (median of 5 repeats of `calls` calls):
  - PyTorch's nn.GroupNorm(8, 32) then ReLU, forward and forward+backward;
  - gpushape's GroupNormAct(8, 32, activation="relu"), the same;
  - the layers of gpushape's call (the checks, the launchers forward and backward, the
    autograd.Function's bodies), and a cProfile of its no-grad forward, so the cost can be
    placed.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path
from host_costs import breakdown, per_call_us

from gpushape.bench.record import environment
from gpushape.kernels import GroupNormAct
from gpushape.kernels.group_norm import _launch, group_norm

SHAPE = (2, 32, 4, 4)
GROUPS = 8


def measure(calls: int) -> dict[str, float]:
    dev = torch.device("cuda")
    x = torch.randn(SHAPE, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    theirs = nn.Sequential(nn.GroupNorm(GROUPS, SHAPE[1]), nn.ReLU()).to(dev, torch.bfloat16)
    ours = GroupNormAct.from_module(theirs[0], "relu")
    params = [x, *theirs[0].parameters()]
    out: dict[str, float] = {}

    def put(name, fn):
        out[name] = per_call_us(fn, calls)
        print(f"{name:48s} {out[name]:8.2f} us", flush=True)

    with torch.no_grad():
        put("PyTorch GroupNorm+ReLU fwd, no grad", lambda: theirs(x))
        put("gpushape GroupNormAct fwd, no grad", lambda: ours(x))
    put("PyTorch GroupNorm+ReLU fwd", lambda: theirs(x))
    put("gpushape GroupNormAct fwd", lambda: ours(x))
    put("PyTorch fwd+bwd", lambda: torch.autograd.grad(theirs(x), params, dy))
    put("gpushape fwd+bwd", lambda: torch.autograd.grad(ours(x), params, dy))
    breakdown(
        "gpushape GroupNormAct fwd+bwd",
        lambda: torch.autograd.grad(ours(x), params, dy),
        {
            "_check": (group_norm, "_check"),
            "group_norm_forward": (group_norm, "group_norm_forward"),
            "group_norm_backward": (group_norm, "group_norm_backward"),
            "plan": (_launch, "plan"),
            "Function.forward body": (group_norm._GroupNormFn, "forward"),
            "Function.backward body": (group_norm._GroupNormFn, "backward"),
        },
        calls,
    )
    profiler = cProfile.Profile()
    with torch.no_grad():
        profiler.enable()
        for _ in range(calls):
            ours(x)
        profiler.disable()
    print(f"cProfile: {calls} GroupNormAct forwards, no grad")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if common.cuda_missing("cuda", "host_group_norm.py"):
        sys.exit(2)
    result = {
        "environment": environment(),
        "command": " ".join(sys.argv),
        "shape": list(SHAPE),
        "groups": GROUPS,
        "us_per_call": measure(args.calls),
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
