"""nchw-conv: convolutions run in contiguous NCHW where channels_last would take the fast path.

cuDNN's tensor-core convolutions work in NHWC; given NCHW tensors it converts them around each
convolution, forward and backward (`tracing/layout.py` says which and counts the bytes). The
cost model prices those conversions into the convolutions' time (`OpCost.layout_s`: the bytes
at the copy rate divided by the efficiency `gpushape probe` measured for them, family
"nchw_conversion", `probe/convs.py`; a patch embedding's 3-channel image at the rate measured
for its patch side, "nchw_conversion@<side>"; a stem's, ResNet's 7x7/2, at the rate measured
for the nearest stride, "nchw_conversion_stem"), and channels_last saves them.

A convolution whose gradient comes back channels_last-strided (its output was permuted to
NHWC: a patch embedding normed over its channels) also copies that gradient to NCHW first, and
a LayerNorm over such a permuted output copies its input (`layout.hidden_copies`): channels_last
saves those copies too (ConvNeXt-T on an H100: the step's strided copies fell by 0.39 ms).

The convolutions are not all a model loses: BatchNorm and pooling run other, slower eager
kernels on NCHW tensors (on the H200, ResNet-50's NCHW BatchNorm kernels took 14.8 ms a step,
the whole channels_last step 14.7: benchmarks/audit/diagnose_nchw.py). The cost model
prices those ops at their NCHW families' measured efficiency (`trace.families.NCHW_VARIANTS`);
converting the model moves them to the channels_last families, and the difference is part of
the saving. Depthwise convolutions and convolutions off tensor cores are left out (no
conversion there). Under torch.compile Inductor converts the layout itself where its heuristic
allows (`modes.inductor_layout_opt`): there the finding saves nothing.

Checked against the H200 (benchmarks/results/baselines-h200/h200-2026-11-30.json): ResNet-50
training, bf16, batch 256 ran 2404 img/s in NCHW and 4654 img/s in channels_last, 106.5
against 55.0 ms a step, a saving of 48 % of the NCHW step (tests/auditing/test_grounding.py);
and the audit's own textbook case in benchmarks/audit/validate_savings.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...tracing.cost import hidden_copy_seconds
from ...tracing.families import NCHW_BASE, memory_family, op_family
from ...tracing.layout import conversion_bytes_of, hidden_copies, nhwc_view_of_nchw, runs_nhwc
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..modes import inductor_layout_opt
from ..patterns import CONV_OPS, first_modules, module_pattern
from ..registry import register_rule

RULE = "nchw-conv"


def layout_bound(ctx: AuditContext) -> tuple[float, list[OpRecord]]:
    """(seconds, ops): what the ops priced at a measured NCHW family (forward and backward)
    take beyond the same bytes at their channels_last family's efficiency."""
    measured = ctx.gpu.achievable.memory_efficiency
    total, ops = 0.0, []
    for rec in ctx.trace.ops:
        family = memory_family(rec)
        if family not in NCHW_BASE:
            continue
        priced = op_family(rec, measured)  # "batch_norm_nchw@16": the size nearest the op's
        if priced is None or priced.partition("@")[0] != family:  # no NCHW figure measured
            continue
        memory_s = ctx.op_cost(rec).memory_s
        total += memory_s * (1 - measured[priced] / ctx.gpu.achievable.memory(NCHW_BASE[family]))
        ops.append(rec)
    return total, ops


def nhwc_view_copies(ctx: AuditContext) -> tuple[float, list[OpRecord]]:
    """(seconds, ops): the copies kernels make first of NHWC views of NCHW activations (a
    LayerNorm over a convolution's channels: ConvNeXt's and Swin's stem norm, forward and
    backward), which a channels_last model reads contiguous."""
    total, ops = 0.0, []
    for rec in ctx.trace.ops:
        copies = hidden_copies(rec)
        if not copies:
            continue
        seconds = hidden_copy_seconds(rec, ctx.gpu)
        saved = sum(s for (t, kind), s in zip(copies, seconds, strict=True) if nhwc_view_of_nchw(t))
        if saved > 0:
            total += saved
            ops.append(rec)
    return total, ops


@register_rule(RULE, title="convolutions in NCHW where channels_last takes the fast path")
def check(ctx: AuditContext) -> Iterable[Finding]:
    convs = [
        r
        for r in ctx.forward_compute()
        if r.name in CONV_OPS
        and len(r.inputs[0].shape) == 4
        and ctx.op_cost(r).tensor_cores
        and not runs_nhwc(r)
    ]
    if not convs:
        return
    ops = [o for r in convs for o in ctx.with_backward(r)]
    nbytes = sum(conversion_bytes_of(o) for o in ops)
    # a backward's copy of its gradient back to NCHW (`layout.hidden_copies`) is in its
    # `layout_s` beside cuDNN's conversions, as the cost model prices them
    copies_s = sum(sum(hidden_copy_seconds(o, ctx.gpu)) for o in ops)
    conversions_s = sum(ctx.op_cost(o).layout_s for o in ops) - copies_s
    efficiency = (  # over every conversion: a patch embedding's runs at its own rate
        min(nbytes / (ctx.bandwidth_bytes_per_s() * conversions_s), 1.0)
        if conversions_s > 0
        else ctx.gpu.achievable.memory("nchw_conversion")
    )
    others_s, others = layout_bound(ctx)
    views_s, views = nhwc_view_copies(ctx)
    saving_s = conversions_s + copies_s + others_s + views_s
    conv_s = sum(ctx.time_s(ctx.with_backward(r)) for r in convs)
    evidence = {
        "convolutions": len(convs),
        "layout": "NCHW (contiguous)",
        "conversion_bytes": nbytes,
        "conv_time_s": conv_s,
        "bandwidth_bytes_per_s": ctx.bandwidth_bytes_per_s(),
        "conversion_efficiency": efficiency,
        "conversions_s": conversions_s,
        "gradient_copies_s": copies_s,
        "nchw_norm_pool_ops": len(others),
        "nchw_norm_pool_s": others_s,
        "nhwc_view_copy_ops": len(views),
        "nhwc_view_copies_s": views_s,
        "modules": first_modules(r.module for r in convs),
        "first_input_shape": list(convs[0].inputs[0].shape),
    }
    converts, why = inductor_layout_opt(ctx.trace)
    if converts:  # under torch.compile the step already runs channels_last
        evidence["saving_by_mode_s"] = {"compile": 0.0}
        evidence["why_quiet"] = {"compile": why}
        evidence["compile_does"] = True  # the compiled step runs without what this saves
    also = (
        f", and {len(others)} BatchNorm/pooling ops run NCHW kernels that are slower on this chip"
        if others_s > 0
        else ""
    )
    if views_s > 0:
        also += f"; {len(views)} ops first copy an NHWC view of NCHW activations"
    message = (
        f"{len(convs)} tensor-core convolutions run NCHW: cuDNN converts each input "
        f"and output to NHWC and back ({nbytes / 1e9:,.2f} GB a step){also}; convert "
        f"the model and its inputs to channels_last"
    )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in convs),
        message,
        evidence,
        saving_s=saving_s,
        fix="channels-last",
        replaces=[*convs, *others, *views],
    )
