"""conv-bias-before-bn: a convolution's bias feeds BatchNorm, which subtracts it right away.

The per-channel bias shifts the batch mean by exactly the bias, so BatchNorm cancels it: the
parameters are wasted and so is the work. PyTorch adds a cuDNN convolution's bias as a
separate pass over the output (read and write it), and training reduces grad_output for the
bias gradient (one more read). The saving priced is those bytes at attainable bandwidth:
2 x output bytes in the forward, plus 1 x in training.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import BATCH_NORM_OPS, CONV_OPS, first_modules, following, module_pattern
from ..registry import register_rule

RULE = "conv-bias-before-bn"


def _feeds_batch_norm(ops: list[OpRecord], pos: int) -> bool:
    out = ops[pos].outputs[0]
    for nxt in following(ops, pos, limit=3):
        if nxt.name in BATCH_NORM_OPS:
            return nxt.inputs[0].shape == out.shape and nxt.inputs[0].dtype == out.dtype
        if nxt.inputs and nxt.inputs[0].numel > 1:  # another op on real data: not a BN next
            return False
    return False


@register_rule(RULE, title="convolution bias cancelled by the BatchNorm after it")
def check(ctx: AuditContext) -> Iterable[Finding]:
    ops = ctx.trace.ops
    sites = [
        r
        for pos, r in enumerate(ops)
        if r.phase == "forward"
        and r.name in CONV_OPS
        and r.has_input("bias")
        and _feeds_batch_norm(ops, pos)
    ]
    if not sites:
        return
    passes = 3 if ctx.train else 2
    nbytes = passes * sum(r.outputs[0].nbytes for r in sites)
    params = sum(r.input("bias").numel for r in sites)
    evidence = {
        "convolutions": len(sites),
        "bias_parameters": params,
        "bytes_saved": nbytes,
        "modules": first_modules(r.module for r in sites),
    }
    message = (
        f"{len(sites)} convolution(s) carry a bias that the following BatchNorm cancels "
        f"({params:,} wasted parameters, {nbytes / 1e6:,.1f} MB of traffic a step): "
        f"use bias=False"
    )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in sites),
        message,
        evidence,
        saving_s=ctx.bytes_time_s(nbytes),
        fix="fold-conv-bias",
        replaces=sites,
    )
