"""`host_cost(trace, gpu) -> HostCost | None`: the host's side of an eager training step.

In eager mode every op of the step is dispatched from Python: the forward's ATen calls (each
recorded for autograd, each launching its kernels), the views between them, every module's
`__call__`, and in backward the autograd engine's ops. When all that takes longer than the
GPU's kernels, the host sets the pace and a fix that shortens the GPU's work saves nothing of
the wall clock. The kernels' launch overhead alone (`launch_overhead_s` x kernels) is a floor:
measured on the H200's host, a Hugging Face BERT step spends several times that.

    host_s = sum over forward ops of host[class] + over backward ops of host[class/backward]
             + views (both passes) x host["view"] + module calls x host["module_glue"]
             + gradient leaves x host["accumulate_grad"]

a class being an op's kind as the host sees it (`CLASSES`: gpushape's own fused row norms and
its other fused ops, convolutions (grouped ones apart: `record_class`), batch norm, layer
norm, GEMMs, attention; any other op is "op", its backward "backward_op"), each rate measured
by `gpushape probe` on the machine (probe/host.py: chains of calls on tiny tensors, so the GPU
never sets the pace; a class it did not measure falls back to "op"). Module calls are the
modules the trace saw running ops (and their parents), once each. `module_glue` is what a
module call costs beyond the ops it dispatches: `Module.__call__` and the Python of its forward
(a library's argument handling, shape arithmetic, mask building), fitted on real models' eager
forwards (probe/host_glue.py); a profile without it prices a call at `module`, the bare
`__call__` of a module that returns its input, which on Hugging Face and timm models left
their forwards 1.3-2.1x short. `accumulate_grad`: the engine's node that hands a parameter
its gradient, one per gradient leaf (`Trace.grad_leaves`); not priced where unmeasured. What
the model misses: the optimizer's step, the allocator's slow paths, and the spread between
hosts (the same model's eager step issued 1.8x faster on one lent H200 host than on another).
None when the profile measured no host rates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .records import Trace

KEYS = ("op", "view", "backward_op", "module")
# seconds per parameter tensor that a foreach optimizer step costs the host beyond the fused
# step, by optimizer class ("<key>/AdamW"), else for any class: probe/host.py measures it,
# tracing/optimizer_step.py prices it
FOREACH_HOST = "optimizer_foreach_tensor"
# Op classes whose host cost the probe measures apart (a library's per-call setup: cuDNN's
# descriptors and heuristics for convolutions and batch norm, cuBLAS's for GEMMs), by the ATen
# op names that belong to them, forward and backward; other ops are "op".
CLASSES = {
    # gpushape's own fused ops (Triton kernels launched from Python, an autograd.Function
    # whose backward runs Python in autograd's worker thread): checked first; its row norms
    # (AddLayerNorm, LayerNormGELU, RMSNorm) apart from its BatchNormAct2d, which launches more
    "gpushape_norm": (
        "gpushape.add_layer_norm",
        "gpushape.dropout_add_layer_norm",
        "gpushape.layer_norm_gelu",
        "gpushape.rms_norm",
    ),
    # its GroupNormAct: one op each way, but the host side of three and four launches
    "gpushape_group_norm": ("gpushape.group_norm_act",),
    "gpushape": ("gpushape.",),
    "conv": ("convolution", "cudnn_convolution"),
    "batch_norm": ("batch_norm",),
    "layer_norm": ("layer_norm", "rms_norm", "group_norm"),
    "gemm": ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.linear."),
    "attention": ("scaled_dot_product", "_flash_attention", "_efficient_attention", "flash_attn."),
}


def op_class(op: str) -> str:
    """The host-cost class of ATen op `op` ("aten.addmm.default" -> "gemm")."""
    for name, needles in CLASSES.items():
        if any(n in op for n in needles):
            return name
    return "op"


def record_class(rec: Any) -> str:
    """The host-cost class of a traced op: `op_class` of its name, and a grouped convolution
    (depthwise ones among them: cuDNN's or PyTorch's own depthwise kernels, set up apart) in
    its own class, "grouped_conv"."""
    cls = op_class(rec.op)
    if cls == "conv" and int(rec.params.get("groups", 1) or 1) > 1:
        return "grouped_conv"
    return cls


# A class a profile has not measured takes this one's rate (profiles from before the class
# existed measured gpushape's fused ops as one class, convolutions as one), else the plain op's.
FALLBACK = {"gpushape_norm": "gpushape", "gpushape_group_norm": "gpushape", "grouped_conv": "conv"}


def rate(rates, cls: str, backward: bool) -> float:
    """Seconds one op of host class `cls` costs the host, forward or backward."""
    while cls not in rates and cls in FALLBACK:
        cls = FALLBACK[cls]
    if backward:
        return rates.get(f"{cls}/backward", rates["backward_op"])
    return rates.get(cls, rates["op"])


@dataclass(frozen=True)
class HostCost:
    forward_ops: int
    views: int
    backward_ops: int
    module_calls: int
    seconds: float
    grad_leaves: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    views = sum(r.kind == "view" for r in trace.ops)  # forward and backward
    computes = [r for r in trace.ops if r.kind == "compute"]
    ops = sum(r.phase == "forward" for r in computes)
    modules = module_calls(trace)
    seconds = ops_seconds(trace.ops, rates) + modules * module_rate(rates)
    seconds += trace.grad_leaves * rates.get("accumulate_grad", 0.0)
    return HostCost(ops, views, len(computes) - ops, modules, seconds, trace.grad_leaves)


def ops_seconds(records, rates) -> float:
    """What dispatching `records` costs the host: each view at the view rate, each compute op
    at its class's rate for its pass (allocations cost nothing)."""
    return sum(
        rates["view"] if r.kind == "view" else rate(rates, record_class(r), r.phase == "backward")
        for r in records
        if r.kind in ("view", "compute")
    )


def module_rate(rates) -> float:
    """Seconds a module call costs beyond its ops: the fitted glue where measured."""
    return rates.get("module_glue", rates["module"])


def forward_seconds(trace: Trace, rates, *, glue: bool = True) -> float:
    """The forward's share of `host_cost`: its ops, its views and (with `glue`) its module
    calls; the part of the step that `module_glue` is fitted against."""
    seconds = ops_seconds((r for r in trace.ops if r.phase == "forward"), rates)
    return seconds + (module_calls(trace) * module_rate(rates) if glue else 0.0)
