"""How far can the host run ahead of the GPU? With the GPU held busy by a sleep kernel, the
host launches small kernels one after another and times each launch: a launch that takes far
longer than the others waited for room in the launch queue. The count before the first such
wait is the queue's depth in kernels of that kind; an eager step whose host runs ahead by more
kernels than that waits on the GPU mid-step (so its wall clock can exceed both its host's time
and its GPU's work, where the two set the pace in turn).

    python benchmarks/steps/launch_queue.py --out $OUT/launch_queue.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.bench.timer import hold_gpu

HOLD_S = 1.0
WAITED = 200e-6  # a launch this long waited for the queue


def kinds() -> dict:
    x = torch.zeros(256, device="cuda")
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    big = [torch.zeros(256, device="cuda") for _ in range(32)]
    return {
        "add_ (1 kernel)": lambda: x.add_(1.0),
        "mm 64x64 bf16 (cuBLAS)": lambda: torch.mm(a, a),
        "foreach_add_ 32 tensors": lambda: torch._foreach_add_(big, 1.0),
        "empty+fill (allocator)": lambda: torch.empty(4096, device="cuda").fill_(1.0),
    }


def depth(launch, limit: int = 20000) -> dict:
    for _ in range(50):
        launch()
    torch.cuda.synchronize()
    hold_gpu(HOLD_S)
    times = []
    t_all = time.perf_counter()
    for _ in range(limit):
        t0 = time.perf_counter()
        launch()
        times.append(time.perf_counter() - t0)
        if times[-1] > WAITED and len(times) > 10:
            break
        if time.perf_counter() - t_all > 0.8 * HOLD_S:
            break
    torch.cuda.synchronize()
    waited = times[-1] > WAITED
    return {
        "launches_before_wait": len(times) - 1 if waited else None,
        "launched": len(times),
        "waited": waited,
        "median_launch_us": statistics.median(times[:-1] if waited else times) * 1e6,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.cuda.init()
    rows = {}
    for name, launch in kinds().items():
        rows[name] = [depth(launch) for _ in range(3)]
        r = rows[name]
        print(
            f"{name:28} before wait {[x['launches_before_wait'] for x in r]} "
            f"launch {statistics.median(x['median_launch_us'] for x in r):.1f} us"
        )
    write_results(args.out, {"hold_s": HOLD_S, "waited_s": WAITED, "kinds": rows})


if __name__ == "__main__":
    main()
