"""attention-head-dim: a head size that keeps scaled_dot_product_attention off its fused kernels.

Read from the SDPA calls the model made (auditing/observe.py). On CUDA, SDPA takes flash attention
for fp16/bf16 without a mask and head size <= 256, else the memory-efficient kernel when the
head size is a multiple of 16 bytes (8 half, 4 float elements), else the math path: Q K^T,
softmax and @ V as separate kernels with the (BH, Tq, Tk) scores in memory. The rule fires when
the head size is what stands in the way: padding it to the next multiple of 16 bytes would
reach a fused kernel. Saving: the math path (pricing/attention.py) minus the fused kernel at the
padded size, forward and backward, priced by the cost model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from ...hardware.alignment import round_up
from ..context import AuditContext
from ..finding import Finding
from ..observe import AttentionCall
from ..patterns import module_pattern
from ..pricing.attention import AttentionShape, fused_backend, fused_records, math_records
from ..registry import register_rule

RULE = "attention-head-dim"


def _shape(call: AttentionCall) -> AttentionShape:
    return AttentionShape(
        bh=math.prod(call.query[:-2]),
        tq=call.query[-2],
        tk=call.key[-2],
        d=call.query[-1],
        dv=call.value[-1],
        dtype=call.dtype,
        has_mask=call.has_mask,
        dropout=call.dropout_p > 0,
    )


def _padded(shape: AttentionShape) -> tuple[AttentionShape, str] | None:
    """The head size padded to 16 bytes, and the fused kernel it reaches (None: none)."""
    align = 8 if shape.dtype in ("float16", "bfloat16") else 4
    padded = dataclasses.replace(shape, d=round_up(shape.d, align), dv=round_up(shape.dv, align))
    backend = fused_backend(padded)
    return (padded, backend) if backend else None


@register_rule(RULE, title="attention head size off SDPA's fused kernels")
def check(ctx: AuditContext) -> Iterable[Finding]:
    sites = []
    for call in ctx.observed.attention:
        shape = _shape(call)
        if fused_backend(shape) is not None:
            continue
        padded = _padded(shape)
        if padded is None:
            continue
        math_s = ctx.price(math_records(shape, ctx.train))
        fused_s = ctx.price(fused_records(padded[0], ctx.train, padded[1]))
        sites.append((call, shape, padded, math_s, fused_s))
    if not sites:
        return
    call, shape, (padded, backend), _, _ = sites[0]
    math_s = sum(s[3] for s in sites)
    fused_s = sum(s[4] for s in sites)
    evidence = {
        "head_dim": shape.d,
        "value_head_dim": shape.dv,
        "padded_to": padded.d,
        "dtype": shape.dtype,
        "mask": shape.has_mask,
        "query_shape": list(call.query),
        "fused_kernel_when_padded": backend,
        "calls": len(sites),
        "time_math_path_s": math_s,
        "time_fused_padded_s": fused_s,
    }
    message = (
        f"head size {shape.d} ({shape.dtype}{', with a mask' if shape.has_mask else ''}) "
        f"sends scaled_dot_product_attention down the math path at {len(sites)} call(s); "
        f"padded to {padded.d} it runs the {backend} kernel"
    )
    yield ctx.finding(
        RULE,
        module_pattern(s[0].module for s in sites),
        message,
        evidence,
        saving_s=max(math_s - fused_s, 0.0),
        replaces=ctx.records_of(s[0].module for s in sites),
        fix="pad-head-dim",
    )
