"""Grouped-query attention as a compiled step runs it.

A decoder with fewer key/value heads than query heads calls SDPA with `enable_gqa=True`.
Eagerly the call is priced at the rate the probe measured for SDPA's own pick of a grouped
call ("default/.../gqa", probe/attention.py), else at the plain call's (the eager LLaMA-style
loops on an H100 ran the same cuDNN kernel as the compiled ones). Compiled, the LLaMA-style
decoder of the library loops (16 query heads, 4 K/V heads, no mask) ran cuDNN's kernel over
all 16 heads, K and V expanded to them, and summed dK and dV back over each group inside a
Triton kernel (`..._squeeze_sum_...`), on an H200 and an H100 (benchmarks/results/loops-h200-5,
loops-h100-8). So a grouped call of a compiled step is priced as the same call with K and V at
the query's heads, at the rate of what SDPA picks for that (cuDNN's on the H200), plus the
expanded K and V written forward and their gradients read backward.
"""

from __future__ import annotations

import math
from typing import Any

from ...tracing.flops.attention import kernel_of
from ...tracing.records import OpRecord
from .attention import fused_records, traced_shape

FLASH = "aten._scaled_dot_product_flash_attention"


def grouped(rec: OpRecord) -> bool:
    """A traced flash call with fewer K/V heads than query heads."""
    return rec.op.startswith(FLASH) and kernel_of(rec, backward=False).gqa


def compiled_flash_s(ctx: Any, rec: OpRecord) -> float:
    """A forward flash call (with its backward when training) as the compiled step runs it:
    as traced unless grouped, else over the query's heads plus the expansion's traffic."""
    if not grouped(rec):
        return ctx.time_s(ctx.with_backward(rec))
    shape = traced_shape(rec)
    causal = bool(rec.params.get("is_causal", False))
    fused = ctx.price(fused_records(shape, ctx.train, "flash", causal=causal))
    # K and V at the query's heads: written once forward, their gradients read once backward
    q = rec.input("query")
    itemsize = q.nbytes // max(math.prod(q.shape), 1)
    expanded = shape.bh * shape.tk * (shape.d + shape.dv) * itemsize
    return fused + ctx.bytes_time_s(expanded * (2 if ctx.train else 1))


def compiled_gqa_saving_s(ctx: Any) -> float:
    """What the compiled step's grouped-query calls save against their eager pricing
    (negative where compiled costs more)."""
    calls = [r for r in ctx.forward_compute() if grouped(r)]
    return sum(ctx.time_s(ctx.with_backward(r)) - compiled_flash_s(ctx, r) for r in calls)
