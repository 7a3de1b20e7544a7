"""slow-stem: a strided convolution on fewer input channels than the tensor-core alignment (the
RGB stem of a CNN), which cuDNN runs far below its GEMMs' rate.

cuDNN pads a 3-channel input to 8 channels on every call and runs an older kernel: the H200's
probe measured ResNet's 7x7 stride-2 stem at 7% of the rate its GEMMs would take aligned (the
profile's `conv_small_cin`, which the cost model already charges it). The same sums run as a
stride-1 convolution over the input folded s x s into aligned channels (s2d-stem,
models/space_to_depth.py): 4x4 on 16 channels for ResNet's stem, 1.31x the multiply-adds.

Fires on forward convolutions of exactly `nn.Conv2d` that s2d-stem takes (ungrouped, undilated,
zero padding, an equal stride of 2 or more, a kernel larger than the stride, fewer input
channels than the alignment). Saving: the traced convolution and its backward, less s2d-stem's
module traced on the same input (its input's fold at the rate the probe measured for it,
"s2d_fold"; its convolution at the rate measured at the nearest folded kernel side: "s2d_stem"
at 4, a 7x7/2 stem's, and "s2d_stem@2", a 3x3/2 stem's). Where the profile lacks those rates the
finding is info, with no saving: the folded convolution's narrow GEMMs run several times below
the model's rate and the fold near a quarter of the copy rate (an H100), so unmeasured they
would promise far too much (0.38 ms for a 3x3/2 stem where 0.02 was measured). The same in every
mode: under torch.compile Inductor calls cuDNN for both convolutions. **Fix:** `s2d-stem`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ...tracing.families import nearest_size
from ...tracing.flops.conv import S2D_FOLD, S2D_STEM, S2D_STEM_SIDE
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding, Severity
from ..patterns import module_pattern, param_pair
from ..registry import register_rule

RULE = "slow-stem"


def takes(rec: OpRecord, align: int) -> bool:
    """Whether s2d-stem rewrites the module that ran this traced forward convolution."""
    x, w = rec.inputs[0], rec.inputs[1]
    if rec.module_type != "Conv2d" or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    (sh, sw), (kh, kw) = param_pair(rec, "stride", 1), tuple(w.shape[2:])
    return (
        not rec.params.get("transposed", False)
        and int(rec.params.get("groups", 1)) == 1
        and param_pair(rec, "dilation", 1) == (1, 1)
        and sh == sw >= 2
        and kh > sh
        and kw > sw
        and x.shape[1] < align
    )


def folded_side(rec: OpRecord) -> int:
    """The kernel side of the stride-1 convolution s2d-stem makes of this one."""
    stride = param_pair(rec, "stride", 1)[0]
    return -(-max(rec.inputs[1].shape[2:]) // stride)


def _replacement_s(ctx: AuditContext, rec: OpRecord, align: int) -> float:
    """s2d-stem's module for this convolution, traced on its input and priced like the trace."""
    from torch import nn

    from ...models.space_to_depth import SpaceToDepthConv2d
    from ...tracing.tracer import trace

    x, w = rec.inputs[0], rec.inputs[1]
    dtype = getattr(torch, str(w.dtype))
    o, c, kh, kw = w.shape
    conv = nn.Conv2d(
        c, o, (kh, kw), param_pair(rec, "stride", 1), param_pair(rec, "padding", 0),
        bias=len(rec.inputs) > 2 and rec.has_input("bias"), device="meta", dtype=dtype,
    )  # fmt: skip
    module = SpaceToDepthConv2d(conv, align)
    grad_input = any(
        b.name == "convolution_backward" and next(iter(b.params.get("output_mask", (1,))))
        for b in ctx.backward_of(rec)
    )
    example = torch.empty(tuple(x.shape), dtype=getattr(torch, str(x.dtype)), device="meta")
    if x.memory_format == "channels_last":
        example = example.contiguous(memory_format=torch.channels_last)
    example.requires_grad_(grad_input)
    ops = trace(module, (example,), train=ctx.train).ops
    return ctx.price(ops)


@register_rule(RULE, title="a strided convolution on few input channels (an RGB stem)")
def check(ctx: AuditContext) -> Iterable[Finding]:
    align = ctx.gpu.tc_alignment("bf16") or 8
    # a padding_mode other than zeros pads in the module before the convolution (reflection,
    # replication, the circular copies): s2d-stem folds only zero padding
    padded = {
        r.module
        for r in ctx.forward_compute()
        if r.module_type == "Conv2d" and r.name != "convolution"
    }
    convs = [
        r
        for r in ctx.forward_compute()
        if r.name == "convolution" and r.module not in padded and takes(r, align)
    ]
    if not convs:
        return
    ops = [o for r in convs for o in ctx.with_backward(r)]
    before_s = ctx.time_s(ops)
    rates = ctx.gpu.achievable.memory_efficiency
    sides = {folded_side(r) for r in convs}
    measured = S2D_FOLD in rates and all(
        nearest_size(S2D_STEM, rates, n, S2D_STEM_SIDE) in rates for n in sides
    )
    after_s = sum(_replacement_s(ctx, r, align) for r in convs) if measured else None
    saving = max(before_s - after_s, 0.0) if after_s is not None else None
    if saving is not None and saving <= 0:
        return
    x, w = convs[0].inputs[0], convs[0].inputs[1]
    evidence = {
        "convolutions": len(convs),
        "input_shape": list(x.shape),
        "weight_shape": list(w.shape),
        "dtype": x.dtype,
        "time_cudnn_s": before_s,
        "time_s2d_s": after_s,
        "s2d_rate_measured": measured,
    }
    if saving is not None:
        evidence["saving_by_mode_s"] = {"eager": saving, "graph": saving, "compile": saving}
    kernel = "x".join(map(str, w.shape[2:]))
    head = (
        f"{len(convs)} strided {kernel} convolution(s) on {x.shape[1]} input channels run "
        f"cuDNN's padded path ({before_s * 1e3:,.3f} ms with the backward)"
    )
    if after_s is None:
        message = (
            f"{head}; folded space-to-depth they would read aligned channels, but this chip's "
            "profile has not measured the fold and the folded convolution (`gpushape probe`)"
        )
        yield ctx.finding(
            RULE, module_pattern(r.module for r in convs), message, evidence,
            saving_s=None, fix="s2d-stem", severity=Severity.INFO, replaces=convs,
        )  # fmt: skip
        return
    message = (
        f"{head}: folded space-to-depth into aligned channels, at stride 1, the same sums take "
        f"{after_s * 1e3:,.3f} ms"
    )
    yield ctx.finding(
        RULE, module_pattern(r.module for r in convs), message, evidence,
        saving_s=saving, fix="s2d-stem", replaces=convs,
    )  # fmt: skip
