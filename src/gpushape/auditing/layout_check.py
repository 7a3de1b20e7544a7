"""nchw-conv checked against the whole model in channels_last.

The rule prices what converting the model saves where it can see it: cuDNN's conversions around
each NCHW convolution, and the NCHW BatchNorm and pooling kernels. Converting changes ops it does
not price too: PyTorch's GroupNorm returns a contiguous (NCHW) tensor whatever it is given, so in
a PoolFormer the convolutions, pools and elementwise ops after each norm mix the two layouts,
and their strided kernels cost more than the conversions saved. On an H100, PoolFormer-S12's
eager step took 2.4 ms longer in channels_last, where the rule had promised 1.3 ms less
(benchmarks/results/loops-h100-28).

So where the rule fires above info, the model is traced again in channels_last (a meta copy,
`cast.channels_last_as`: about as long as the first trace) and priced in the audited mode. The
finding's saving becomes the difference of the two steps' GPU time where that is smaller than
its own; where the channels_last step is predicted no faster, the finding is info, its message
saying so, as `gpushape optimize`'s guard would roll the fix back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from .context import AuditContext
from .finding import Finding, Severity, severity_for_share
from .modes import step_time

RULE = "nchw-conv"
AGREES = 0.8  # a whole-model saving at least this share of the rule's leaves the finding be
SLOWER_SHOWN = 3
SHOWN_FROM_S = 5e-5  # an op growing less than this is not named


def nchw_makers(other: AuditContext) -> list[str]:
    """The module types whose forward ops, in the channels_last trace, take a channels_last 4-D
    tensor and return a contiguous (NCHW) one: where the layout turns back."""
    found: dict[str, None] = {}
    for rec in other.trace.ops:
        if rec.phase != "forward" or not rec.inputs or not rec.outputs:
            continue
        x, y = rec.inputs[0], rec.outputs[0]
        if (
            len(x.shape) == len(y.shape) == 4
            and y.shape[1] > 1
            and y.shape[2] * y.shape[3] > 1  # (N, C, 1, 1) is both layouts at once
            and x.memory_format == "channels_last"
            and y.memory_format == "contiguous"
        ):
            found[rec.module_type or rec.name] = None
    return list(found)


def slower_ops(ctx: AuditContext, other: AuditContext) -> list[tuple[str, float]]:
    """The ops (by name, forward and backward together) whose kernels take longest beyond their
    NCHW time in the channels_last trace, longest first."""
    totals: dict[str, float] = {}
    for sign, c in ((-1.0, ctx), (1.0, other)):
        for op in c.cost.ops:
            name = op.op.split(".")[1]  # "aten.add.Tensor": "add"
            totals[name] = totals.get(name, 0.0) + sign * op.kernel_time_s
    grown = sorted(((n, s) for n, s in totals.items() if s >= SHOWN_FROM_S), key=lambda kv: -kv[1])
    return grown[:SLOWER_SHOWN]


def checked_layout(
    found: Sequence[Finding],
    ctx: AuditContext,
    channels_last_ctx: Callable[[], AuditContext | None],
    mode: str,
) -> list[Finding]:
    """`found` with nchw-conv's finding held to the whole channels_last step's difference.
    `channels_last_ctx()`: the audit context of the model traced in channels_last (None where
    it cannot be traced)."""
    i = next(
        (i for i, f in enumerate(found) if f.rule == RULE and f.severity > Severity.INFO), None
    )
    if i is None or found[i].est_saving_s is None:
        return list(found)
    other = channels_last_ctx()
    if other is None:
        return list(found)
    f = found[i]
    before, after = step_time(ctx, mode).gpu_s, step_time(other, mode).gpu_s
    whole = before - after
    if whole >= AGREES * f.est_saving_s:
        return list(found)
    slower, makers = slower_ops(ctx, other), nchw_makers(other)[:SLOWER_SHOWN]
    evidence = {
        **f.evidence,
        "rule_saving_s": f.est_saving_s,
        "whole_model_gpu_s": {"nchw": before, "channels_last": after},
        "slower_in_channels_last_s": dict(slower),
        "return_nchw": makers,
    }
    named = ", ".join(f"{op} +{s * 1e3:,.2f} ms" for op, s in slower)
    said = (
        f"; but traced in channels_last the whole model is predicted at {after * 1e3:,.3f} ms "
        f"of GPU work against {before * 1e3:,.3f} ms as given"
        + (f": {_names(makers)} NCHW, leaving the layout mixed" if makers else "")
        + (f"; these grow most: {named}" if named else "")
    )
    if whole <= 0:
        message = f"{f.message}{said}. Converting saves nothing: leave the layout as it is"
        out = dataclasses.replace(
            f, severity=Severity.INFO, est_saving_s=0.0, message=message, evidence=evidence
        )
    else:
        share = whole / ctx.step_time_s if ctx.step_time_s > 0 else None
        message = f"{f.message}{said}. Of the saving, {whole * 1e3:,.3f} ms reach the step"
        out = dataclasses.replace(
            f,
            severity=severity_for_share(share),
            est_saving_s=whole,
            message=message,
            evidence={**evidence, "share_of_step": round(share or 0.0, 5)},
        )
    return [*found[:i], out, *found[i + 1 :]]


def _names(types: list[str]) -> str:
    """'GroupNorm returns' or 'GroupNorm and LayerNorm2d return'."""
    if len(types) == 1:
        return f"{types[0]} returns"
    return f"{', '.join(types[:-1])} and {types[-1]} return"
