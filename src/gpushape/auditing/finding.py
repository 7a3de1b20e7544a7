"""`Finding`: one thing in a design the target GPU dislikes, with what fixing it is worth.

Severity follows the estimated saving, never the rule's name:

| severity | time findings: est_saving_s / step time | memory findings: bytes / activation memory |
| --- | --- | --- |
| high   | >= 5 %   | >= 25 % (and the step does not fit, see checkpoint-candidate) |
| medium | >= 1 %   | >= 10 % |
| low    | >= 0.1 % | >= 2 % |
| info   | below, or a saving of about zero on this chip | below |

"The step" is the cost model's roofline time of the traced step (forward, plus backward in
training). Savings count GPU time; launch overheads count too only when the step is
launch-bound (eager launches outlast the kernels), since otherwise the GPU's queue hides them.
A rule whose fix saves about nothing on the target chip reports at most `info`: advice must
hold for the chip named. Rules with no time estimate (dataloader, an optimizer we
cannot trace) carry `est_saving_s = None` and state their own severity rule in their docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[str(text).strip().upper()]
        except KeyError:
            known = ", ".join(s.label for s in sorted(cls, reverse=True))
            raise ValueError(f"unknown severity {text!r}; known: {known}") from None


# Lower bounds of each severity, as a share of the step time (time findings) ...
TIME_SHARE_THRESHOLDS = ((Severity.HIGH, 0.05), (Severity.MEDIUM, 0.01), (Severity.LOW, 0.001))
# ... and as a share of the activation memory (memory findings).
MEMORY_SHARE_THRESHOLDS = ((Severity.HIGH, 0.25), (Severity.MEDIUM, 0.10), (Severity.LOW, 0.02))


def severity_for_share(
    share: float | None, thresholds: tuple[tuple[Severity, float], ...] = TIME_SHARE_THRESHOLDS
) -> Severity:
    """The severity a saving of `share` (a fraction) earns; None or NaN is info."""
    if share is None or not math.isfinite(share):
        return Severity.INFO
    for severity, lower in thresholds:
        if share >= lower:
            return severity
    return Severity.INFO


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One finding. `evidence` holds the dims, dtypes and shapes that triggered it (plain JSON
    values) and where its numbers came from; `fix` names a transform id from `fixes.FIXES`."""

    rule: str
    severity: Severity
    module: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    est_saving_s: float | None = None
    fix: str | None = None
    # The trace positions (forward and backward) of the ops the fix rewrites; None when the fix
    # acts on nothing traced. Two fixes overlap when they rewrite an op in common (`combine.py`).
    replaces: frozenset[int] | None = field(default=None, compare=False, repr=False)
    # "rule @ module" of a larger fix that rewrites some of the same ops, counted instead of
    # this one; `inside`: that fix rewrites every op this one does (it subsumes it).
    subsumed_by: str | None = None
    inside: bool = False

    @property
    def label(self) -> str:
        return f"{self.rule} @ {self.module or '(model)'}"

    @property
    def gpu_severity(self) -> Severity:
        """The severity its GPU saving earns: `severity` unless the audited mode graded it
        down by the wall clock (a host-bound eager step), as `evidence` then records."""
        label = self.evidence.get("severity_by_gpu_time")
        return Severity.parse(label) if label else self.severity

    def to_dict(self) -> dict[str, Any]:
        evidence = dict(self.evidence)
        if self.subsumed_by:
            evidence["subsumed_by"] = self.subsumed_by
            evidence["subsumed_whole"] = self.inside
        return {
            "rule": self.rule,
            "severity": self.severity.label,
            "module": self.module,
            "message": self.message,
            "evidence": _plain(evidence),
            "est_saving_s": self.est_saving_s,
            "fix": self.fix,
        }

    @property
    def sort_key(self) -> tuple:
        """Largest saving first; findings without a time estimate by severity after them."""
        saving = self.est_saving_s if self.est_saving_s is not None else -1.0
        return (-saving, -int(self.severity), self.rule, self.module)


def _plain(value: Any) -> Any:
    """JSON-ready: tuples as lists, non-finite floats as strings, keys as strings."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: f.sort_key)
