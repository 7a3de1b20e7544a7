"""The host's rates for an eager training step: what one op, view, backward op and module call
cost the CPU (seconds each), as `tracing/host.py` prices a traced step.

Each is a loop of many calls on a one-element tensor, so the GPU's work is negligible and the
time is the host's: PyTorch's Python binding, the dispatcher, autograd's recording, the CUDA
launch. `op`: `y = x * 1.5` on a tensor that needs a gradient (an op recorded for autograd,
one kernel); `view`: `x.view(-1)` on it; `backward_op`: the backward of a chain of those
multiplications, per link (the engine runs one node and launches one kernel a link; the
chain's forward is not timed); `module`: an `nn.Module` whose forward returns its input,
called, less the same plain function called (what `Module.__call__` adds). Medians over
`repeats` runs; the first run of each warms the caches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

CALLS = 2000


class _Pass(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _pass(x: torch.Tensor) -> torch.Tensor:
    return x


def _median_s(run: Callable[[], Any], device: torch.device, repeats: int) -> float:
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_host(device: str = "cuda", *, calls: int = CALLS, repeats: int = 5) -> dict[str, Any]:
    """{"op": {"seconds": ..., "workload": ...}, "view": ..., "backward_op": ..., "module": ...}"""
    dev = torch.device(device)
    x = torch.ones(1, device=dev, requires_grad=True)

    def ops() -> None:
        for _ in range(calls):
            x * 1.5

    def views() -> None:
        for _ in range(calls):
            x.view(-1)

    module, plain = _Pass(), _pass

    def modules() -> None:
        for _ in range(calls):
            module(x)

    def functions() -> None:
        for _ in range(calls):
            plain(x)

    def backward() -> float:
        y = x
        for _ in range(calls):
            y = y * 1.0001
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        y.backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        x.grad = None
        return time.perf_counter() - t0

    backward()  # warm-up
    rows = {
        "op": (_median_s(ops, dev, repeats), "y = x * 1.5, x needing a gradient"),
        "view": (_median_s(views, dev, repeats), "x.view(-1)"),
        "backward_op": (
            statistics.median(backward() for _ in range(repeats)),
            "backward of a chain of multiplications, per link",
        ),
        "module": (
            max(_median_s(modules, dev, repeats) - _median_s(functions, dev, repeats), 0.0),
            "nn.Module returning its input, less a plain function",
        ),
    }
    return {
        key: {"seconds": total / calls, "workload": what, "calls": calls}
        for key, (total, what) in rows.items()
    }
