"""`host_cost(trace, gpu) -> HostCost | None`: the host's side of an eager training step.

In eager mode every op of the step is dispatched from Python: the forward's ATen calls (each
recorded for autograd, each launching its kernels), the views between them, every module's
`__call__`, and in backward the autograd engine's ops. When all that takes longer than the
GPU's kernels, the host sets the pace and a fix that shortens the GPU's work saves nothing of
the wall clock. The kernels' launch overhead alone (`launch_overhead_s` x kernels) is a floor:
measured on the H200's host, a Hugging Face BERT step spends several times that.

    host_s = forward ops x host["op"] + views (both passes) x host["view"]
             + backward ops x host["backward_op"] + module calls x host["module"]

each rate measured by `gpushape probe` on the machine (probe/host.py: loops of tiny ops, so the
GPU never sets the pace). Module calls are the modules the trace saw running ops (and their
parents), once each. What the model misses: Python in a module's forward beyond the ops it
dispatches (a library's argument handling, mask building), the optimizer's step, the
allocator's slow paths. None when the profile measured no host rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .records import Trace

KEYS = ("op", "view", "backward_op", "module")


@dataclass(frozen=True)
class HostCost:
    forward_ops: int
    views: int
    backward_ops: int
    module_calls: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward_ops": self.forward_ops,
            "views": self.views,
            "backward_ops": self.backward_ops,
            "module_calls": self.module_calls,
            "seconds": self.seconds,
        }


def module_calls(trace: Trace) -> int:
    """Modules that ran ops, with their parents: each called at least once."""
    names: set[str] = set()
    for rec in trace.ops:
        if rec.phase != "forward":
            continue
        parts = rec.module.split(".") if rec.module else []
        for i in range(len(parts) + 1):
            names.add(".".join(parts[:i]))
    return len(names)


def host_cost(trace: Trace, gpu: Any) -> HostCost | None:
    rates = getattr(getattr(gpu, "achievable", None), "host", None) or {}
    if not all(k in rates for k in KEYS):
        return None
    forward = [r for r in trace.ops if r.phase == "forward" and r.kind != "alloc"]
    views = sum(r.kind == "view" for r in trace.ops)  # forward and backward
    ops = sum(r.kind == "compute" for r in forward)
    backward = sum(r.phase == "backward" and r.kind == "compute" for r in trace.ops)
    modules = module_calls(trace)
    seconds = (
        ops * rates["op"]
        + views * rates["view"]
        + backward * rates["backward_op"]
        + modules * rates["module"]
    )
    return HostCost(ops, views, backward, modules, seconds)
