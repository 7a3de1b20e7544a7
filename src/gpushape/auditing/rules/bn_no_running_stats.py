"""bn-no-running-stats: BatchNorm with `track_running_stats=False`.

Such a BatchNorm normalizes with batch statistics even in eval mode, so at inference it can be
neither folded into the convolution before it nor fused: it stays two passes over its input
(statistics, then normalize). The saving priced is what folding would remove from an inference
forward: the forward batch-norm ops' time, as a share of the forward. Its fix changes what the
model computes (statistics learned during training instead of per batch), so no transform
applies it silently: `fix` is null and the message says what to do.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from ..context import AuditContext
from ..finding import Finding
from ..patterns import BATCH_NORM_OPS, first_modules, module_pattern
from ..registry import register_rule

RULE = "bn-no-running-stats"


def _no_stats_modules(ctx: AuditContext) -> list[str]:
    if ctx.model is None:
        return []
    return [
        name
        for name, m in ctx.model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats
    ]


@register_rule(RULE, title="BatchNorm without running statistics")
def check(ctx: AuditContext) -> Iterable[Finding]:
    modules = set(_no_stats_modules(ctx))
    if not modules:
        return
    ops = [r for r in ctx.forward_compute() if r.module in modules and r.name in BATCH_NORM_OPS]
    if not ops:
        return
    saving_s = ctx.time_s(ops)
    names = sorted(modules)
    evidence = {
        "batch_norms": len(names),
        "track_running_stats": False,
        "forward_bn_time_s": saving_s,
        "basis": "inference forward",
        "modules": first_modules(names),
        "input_shape": list(ops[0].inputs[0].shape),
    }
    message = (
        f"{len(names)} BatchNorm layer(s) keep no running statistics: at inference they "
        f"normalize per batch and cannot be folded into the convolution before them; "
        f"set track_running_stats=True (and retrain) if per-batch statistics are not "
        f"what the model needs"
    )
    yield ctx.finding(
        RULE,
        module_pattern(names),
        message,
        evidence,
        saving_s=saving_s,
        fix=None,
        basis_s=ctx.forward_time_s,
    )
