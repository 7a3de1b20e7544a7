"""A Linear's bias gradient (a column sum, `grad.sum(0)`) as eager PyTorch runs it and as
Inductor does.

Eager, PyTorch's reduction kernel sums narrow columns far below the copy rate: the H200 summed
16384 rows of 768 at 0.24 of it, against 0.48 for its probe's 1024-wide sum over 65536 rows
(`benchmarks/kernels/probe_bias_grad.py`); the cost model prices each column sum at the rate
measured for the width nearest its own ("reduction@<width>", tracing/families.py). Inductor
generates its own reduction (the same 768-wide sum at 0.81 of the copy rate, standalone) and
mostly fuses it into the pointwise kernel that makes the gradient: under torch.compile a
column sum is priced at no worse than the family's own rate.
"""

from __future__ import annotations

from typing import Any

from ...tracing.families import memory_family, op_family
from ...tracing.sums import sum_shape

FAMILY = "reduction"


def column_sums(trace: Any) -> list[int]:
    """The trace indices of the step's column sums (a bias gradient's `sum(0)`)."""
    return [r.index for r in trace.ops if _column_sum(r)]


def compiled_column_sum_saving_s(ctx: Any) -> float:
    """GPU seconds the step's narrow column sums cost eager beyond the reduction family's own
    rate, which Inductor's kernels reach (0 where no width below it is measured)."""
    achievable = ctx.gpu.achievable
    base = achievable.memory(FAMILY)
    saving = 0.0
    for r in ctx.trace.ops:
        if not _column_sum(r):
            continue
        rate = achievable.memory(op_family(r, achievable.memory_efficiency))
        if rate < base:
            saving += ctx.op_cost(r).kernel_time_s * (1.0 - rate / base)
    return saving


def _column_sum(r: Any) -> bool:
    """A column sum priced as one (tracing/sums.py); NCHW per-channel sums are left to the
    fusion pricing (pricing/inductor_fusion.py), as Inductor fuses them into their producer."""
    shape = sum_shape(r)
    return shape is not None and shape[0] == FAMILY and memory_family(r) == FAMILY
