"""optimizer-not-fused: an optimizer stepping parameter by parameter, or op by op over lists,
where a fused implementation exists.

Priced by running the optimizer's step on meta stand-ins (tracing/optimizer_step.py): its kernels
and bytes, against the fused step's single pass. Time of a step = the longer of its GPU time
(the bytes at the rate the profile fitted for the implementation's kernels, plus a time per
parameter tensor per kernel: `step_gpu_s`) and the kernels x the eager launch overhead (the CPU
launches, the GPU streams). The saving is a share of the traced step plus the optimizer's own step.
When the step cannot be run on meta (an optimizer outside torch.optim that needs real values),
there is no estimate: the saving is null, and severity is medium for a for-loop
implementation, low for foreach where a fused one exists.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ...tracing.optimizer_step import (
    StepCost,
    current_step,
    fused_step,
    implementation,
    step_gpu_s,
    supports,
)
from ..context import AuditContext
from ..finding import Finding, Severity
from ..registry import register_rule

RULE = "optimizer-not-fused"


def _step_s(ctx: AuditContext, step: StepCost) -> float:
    return max(
        step_gpu_s(step, ctx.optimizer, ctx.gpu),
        step.kernels * ctx.gpu.achievable.launch_overhead_s,
    )


def _better(optimizer: torch.optim.Optimizer, impl: str) -> str | None:
    if supports(optimizer, "fused"):
        return "fused"
    if impl == "for-loop" and supports(optimizer, "foreach"):
        return "foreach"
    return None


@register_rule(RULE, title="optimizer not fused")
def check(ctx: AuditContext) -> Iterable[Finding]:
    opt = ctx.optimizer
    if not isinstance(opt, torch.optim.Optimizer):
        return
    impl = implementation(opt)
    better = _better(opt, impl)
    if impl == "fused" or better is None:
        return
    name = type(opt).__name__
    evidence = {"optimizer": name, "implementation": impl, "better": better}
    message = f"{name} steps with the {impl} implementation: construct it with {better}=True"
    try:
        now, fused = ctx.optimizer_step or current_step(opt), fused_step(opt)
    except Exception as exc:  # an optimizer that needs real values: no estimate
        evidence["no_estimate"] = f"{type(exc).__name__}: {exc}"[:200]
        severity = Severity.MEDIUM if impl == "for-loop" else Severity.LOW
        yield ctx.finding(
            RULE, "", message, evidence, saving_s=None, fix="fused-optimizer", severity=severity
        )
        return
    now_s, fused_s = _step_s(ctx, now), _step_s(ctx, fused)
    evidence |= {
        "parameters": now.parameters,
        "kernels": now.kernels,
        "bytes_moved": now.bytes_moved,
        "fused_kernels": fused.kernels,
        "fused_bytes_moved": fused.bytes_moved,
        "time_step_s": now_s,
        "time_fused_step_s": fused_s,
    }
    message += (
        f" ({now.kernels} kernels and {now.bytes_moved / 1e6:,.1f} MB a step against "
        f"{fused.kernels} and {fused.bytes_moved / 1e6:,.1f} MB fused)"
    )
    yield ctx.finding(
        RULE,
        "",
        message,
        evidence,
        saving_s=max(now_s - fused_s, 0.0),
        fix="fused-optimizer",
        basis_s=ctx.step_time_s + now_s,
    )
