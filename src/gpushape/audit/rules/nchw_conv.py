"""nchw-conv: convolutions run in contiguous NCHW where channels_last would take the fast path.

cuDNN's tensor-core convolutions work in NHWC. Given NCHW tensors it converts them: the input
to NHWC and the output back before the forward, grad_output in and grad_input out for the
input gradient, input and grad_output again for the weight gradient. Each conversion reads and
writes the tensor once (`trace.families.nchw_conversion_bytes`):
    forward:   2 x (x + y)      grad_input: 2 x (dy + dx)      grad_weight: 2 x (x + dy)
The conversions are priced at the chip's copy rate divided by the efficiency `gpushape probe`
measured for them (family "nchw_conversion", `bench/probe_layout.py`: NCHW against
channels_last convolutions, timed); unmeasured, the copy rate.

The convolutions are not all a model loses: BatchNorm and pooling run other, slower eager
kernels on NCHW tensors (on the H200, ResNet-50's NCHW BatchNorm kernels took 14.8 ms a step,
the whole channels_last step 14.7: benchmarks/audit/diagnose_nchw.py). The cost model
prices those ops at their NCHW families' measured efficiency (`trace.families.NCHW_VARIANTS`);
converting the model moves them to the channels_last families, and the difference is part of
the saving.
A convolution runs NHWC when its input or its weight is channels_last (cuDNN's own rule), so
the weight's strides count too: on the meta device, convolution outputs come back contiguous
even for channels_last inputs, while a channels_last model's weights keep their strides.
Depthwise convolutions and convolutions off tensor cores are left out (no conversion there).

Checked against the H200 (anchors/h200-2026-11-30.json): ResNet-50 training, bf16, batch 256
ran 2404 img/s in NCHW and 4654 img/s in channels_last, 106.5 against 55.0 ms a step, a
saving of 48 % of the NCHW step. tests/audit/test_nchw_anchor.py compares this estimate's
share of the cost model's step with that 48 %.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...trace.families import NCHW_VARIANTS, memory_family, nchw_conversion_bytes
from ...trace.records import OpRecord, TensorMeta
from ..context import AuditContext
from ..finding import Finding
from ..patterns import CONV_OPS, first_modules, module_pattern
from ..registry import register_rule

RULE = "nchw-conv"


def channels_last_strides(t: TensorMeta) -> bool:
    """Whether PyTorch's `suggest_memory_format` would call `t` channels_last: the strides
    order C, W, H, N (ties from size-1 dimensions broken as PyTorch breaks them)."""
    if len(t.shape) != 4 or len(t.strides) != 4 or 0 in t.shape:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        stride, size = t.strides[d], t.shape[d]
        if stride < smallest or (d == 0 and smallest == t.strides[1]):
            return False
        smallest = stride * size if size > 1 else stride
    return True


def runs_nhwc(rec: OpRecord) -> bool:
    x, w = rec.inputs[0], rec.input("weight") if rec.has_input("weight") else rec.inputs[1]
    return x.channels_last or channels_last_strides(x) or channels_last_strides(w)


def conversion_bytes(ctx: AuditContext, rec: OpRecord) -> int:
    grad_input = grad_weight = False
    for back in ctx.backward_of(rec):  # autograd may file a gradient's add under the conv too
        if "convolution_backward" not in back.name:
            continue
        mask = tuple(back.params.get("output_mask", (True, True, True)))
        grad_input |= bool(mask[0])
        grad_weight |= len(mask) > 1 and bool(mask[1])
    return nchw_conversion_bytes(rec.inputs[0].nbytes, rec.outputs[0].nbytes,
                                 grad_input=grad_input, grad_weight=grad_weight)


def layout_bound(ctx: AuditContext) -> tuple[float, int]:
    """(seconds, ops): what the ops priced at a measured NCHW family (forward and backward)
    take beyond the same bytes at their channels_last family's efficiency."""
    measured = ctx.gpu.achievable.memory_efficiency
    nchw_base = {nchw: base for base, nchw in NCHW_VARIANTS.items()}
    total, ops = 0.0, 0
    for rec in ctx.trace.ops:
        family = memory_family(rec)
        if family not in nchw_base or family not in measured:
            continue
        memory_s = ctx.op_cost(rec).memory_s
        total += memory_s * (1 - measured[family] / ctx.gpu.achievable.memory(nchw_base[family]))
        ops += 1
    return total, ops


@register_rule(RULE, title="convolutions in NCHW where channels_last takes the fast path")
def check(ctx: AuditContext) -> Iterable[Finding]:
    convs = [r for r in ctx.forward_compute() if r.name in CONV_OPS
             and len(r.inputs[0].shape) == 4 and ctx.op_cost(r).tensor_cores
             and not runs_nhwc(r)]
    if not convs:
        return
    nbytes = sum(conversion_bytes(ctx, r) for r in convs)
    efficiency = ctx.gpu.achievable.memory_efficiency.get("nchw_conversion", 1.0)
    conversions_s = ctx.bytes_time_s(nbytes) / efficiency
    others_s, others = layout_bound(ctx)
    saving_s = conversions_s + others_s
    conv_s = sum(ctx.time_s(ctx.with_backward(r)) for r in convs)
    evidence = {"convolutions": len(convs), "layout": "NCHW (contiguous)",
                "conversion_bytes": nbytes, "conv_time_s": conv_s,
                "bandwidth_bytes_per_s": ctx.bandwidth_bytes_per_s(),
                "conversion_efficiency": efficiency, "conversions_s": conversions_s,
                "nchw_norm_pool_ops": others, "nchw_norm_pool_s": others_s,
                "modules": first_modules(r.module for r in convs),
                "first_input_shape": list(convs[0].inputs[0].shape)}
    also = (f", and {others} BatchNorm/pooling ops run NCHW kernels that are slower on this "
            f"chip" if others_s > 0 else "")
    message = (f"{len(convs)} tensor-core convolutions run NCHW: cuDNN converts each input "
               f"and output to NHWC and back ({nbytes / 1e9:,.2f} GB a step){also}; convert "
               f"the model and its inputs to channels_last")
    yield ctx.finding(RULE, module_pattern(r.module for r in convs), message, evidence,
                      saving_s=saving_s, fix="channels-last")
