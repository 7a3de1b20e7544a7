"""nchw-conv: convolutions run in contiguous NCHW where channels_last would take the fast path.

cuDNN's tensor-core convolutions work in NHWC. Given NCHW tensors it converts them: the input
to NHWC and the output back before the forward, grad_output in and grad_input out for the
input gradient, input and grad_output again for the weight gradient. Each conversion reads and
writes the tensor once, so the saving priced here is those bytes at the chip's attainable
bandwidth:
    forward:   2 x (x + y)      grad_input: 2 x (dy + dx)      grad_weight: 2 x (x + dy)
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
    x, y = rec.inputs[0].nbytes, rec.outputs[0].nbytes
    total = 2 * (x + y)
    for back in ctx.backward_of(rec):
        mask = tuple(back.params.get("output_mask", (True, True, True)))
        if mask[0]:
            total += 2 * (y + x)  # dy in, dx out (dx is x-sized)
        if len(mask) > 1 and mask[1]:
            total += 2 * (x + y)  # x and dy in
    return total


@register_rule(RULE, title="convolutions in NCHW where channels_last takes the fast path")
def check(ctx: AuditContext) -> Iterable[Finding]:
    convs = [r for r in ctx.forward_compute() if r.name in CONV_OPS
             and len(r.inputs[0].shape) == 4 and ctx.op_cost(r).tensor_cores
             and not runs_nhwc(r)]
    if not convs:
        return
    nbytes = sum(conversion_bytes(ctx, r) for r in convs)
    saving_s = ctx.bytes_time_s(nbytes)
    conv_s = sum(ctx.time_s(ctx.with_backward(r)) for r in convs)
    evidence = {"convolutions": len(convs), "layout": "NCHW (contiguous)",
                "conversion_bytes": nbytes, "conv_time_s": conv_s,
                "bandwidth_bytes_per_s": ctx.bandwidth_bytes_per_s(),
                "modules": first_modules(r.module for r in convs),
                "first_input_shape": list(convs[0].inputs[0].shape)}
    message = (f"{len(convs)} tensor-core convolutions run NCHW: cuDNN converts each input "
               f"and output to NHWC and back ({nbytes / 1e9:,.2f} GB a step); convert the "
               f"model and its inputs to channels_last")
    yield ctx.finding(RULE, module_pattern(r.module for r in convs), message, evidence,
                      saving_s=saving_s, fix="channels-last")
