"""dataloader: a DataLoader that starves the GPU: no workers, no pinned memory, no persistent
workers.

There is no time estimate (the cost of loading depends on the dataset, not on the chip), so the
saving is null and severity follows a stated rule:
- num_workers == 0: medium. Loading and collating run on the training thread, in series with
  every step.
- pin_memory False: low. Host-to-device copies come from pageable memory, which the driver
  stages through a pinned buffer and which cannot overlap compute (non_blocking needs pinned).
- num_workers > 0 without persistent_workers: low. Workers are re-spawned every epoch.
The settings to use instead come from `gpushape.data.advice_for_loader` (workers from the cores
this process may use, pinned memory where CUDA is, a prefetch factor), with its reasoning in the
evidence; measure the load time with `gpushape.data.recommend_loader(dataset, batch_size)`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...data import DataPipelineError, advice_for_loader
from ..context import AuditContext
from ..finding import Finding, Severity
from ..registry import register_rule

RULE = "dataloader"


def problems(loader) -> list[tuple[Severity, str, str]]:
    workers = int(getattr(loader, "num_workers", 0) or 0)
    out = []
    if workers == 0:
        out.append(
            (
                Severity.MEDIUM,
                "num_workers=0",
                "loads and collates batches on the training thread, in series with the "
                "GPU: give it worker processes (num_workers > 0)",
            )
        )
    if not getattr(loader, "pin_memory", False):
        out.append(
            (
                Severity.LOW,
                "pin_memory=False",
                "copies batches from pageable memory, which cannot overlap compute: set "
                "pin_memory=True and copy with non_blocking=True",
            )
        )
    if workers > 0 and not getattr(loader, "persistent_workers", False):
        out.append(
            (
                Severity.LOW,
                "persistent_workers=False",
                "re-spawns its workers every epoch: set persistent_workers=True",
            )
        )
    return out


@register_rule(RULE, title="DataLoader without workers, pinned memory or persistent workers")
def check(ctx: AuditContext) -> Iterable[Finding]:
    if ctx.dataloader is None:
        return
    loader = ctx.dataloader
    settings = {
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "batch_size": getattr(loader, "batch_size", None),
    }
    advice = _advice(loader)
    for severity, setting, text in problems(loader):
        evidence = {
            **settings,
            "setting": setting,
            "severity_rule": "no time estimate: num_workers=0 medium, others low",
        }
        if advice is not None:
            evidence["recommended"] = advice.loader_kwargs()
            evidence["reasoning"] = list(advice.reasoning)
            text += f" (recommended here: {_recommended(advice, setting)})"
        yield ctx.finding(
            RULE,
            "",
            f"the DataLoader {text}",
            evidence,
            saving_s=None,
            fix="dataloader-workers",
            severity=severity,
        )


def _advice(loader):
    try:
        return advice_for_loader(loader)
    except (DataPipelineError, TypeError, AttributeError):
        return None  # no batch_size (a batch_sampler) or not a DataLoader: the settings alone


def _recommended(advice, setting: str) -> str:
    kwargs = advice.loader_kwargs()
    name = setting.split("=")[0]
    if name == "num_workers":
        return f"num_workers={kwargs['num_workers']} of {advice.cores} cores"
    return f"{name}={kwargs.get(name)}"
