"""What the fixes save together: a non-overlapping set of them, the fixed step costed once.

Two findings can describe the same ops: hand-written attention (manual-attention, fixed by
SDPA) contains the softmax and dropout that unfused-softmax-dropout would fuse; a fp32 GEMM
that misses the alignment is in both fp32-math and tc-align. Their savings do not add: SDPA
removes the softmax kernel that the fusion would have sped up. So:

1. Fixes are taken largest saving first; a fix that rewrites an op (forward or backward) an
   already taken fix rewrites is marked `subsumed_by` that fix and not counted (`inside` when
   the taken fix rewrites all of its ops). The manual-attention example: where SDPA's fused
   kernel is no faster for a masked attention, fusing softmax and dropout saves more and is
   counted, and manual-attention is marked as overlapping it.
2. The fixed step is costed once: every op no taken fix touches, as the cost model prices it,
   plus what each taken fix runs instead of its ops (their time less its saving, never below
   zero). The combined saving is the step as traced less the fixed step, so it can never exceed
   the time of the ops it rewrites, nor the step.

Only findings that name a fix and the ops it rewrites (`Finding.replaces`) take part; memory
findings and advice with no transform are shown as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .context import AuditContext
from .finding import Finding


@dataclass(frozen=True, kw_only=True)
class Combined:
    """The fix plan's total."""

    step_s: float
    """The traced step as the cost model prices it (ops as savings count them)."""
    fixed_step_s: float
    """The same step with every taken fix applied, costed once."""
    fixes: tuple[str, ...]
    """"rule @ module" of each fix counted, largest saving first."""
    subsumed: tuple[str, ...]
    """Findings left out because a counted fix rewrites the same ops."""

    @property
    def saving_s(self) -> float:
        return max(self.step_s - self.fixed_step_s, 0.0)

    def to_dict(self) -> dict:
        return {
            "saving_s": self.saving_s,
            "step_s": self.step_s,
            "fixed_step_s": self.fixed_step_s,
            "fixes": list(self.fixes),
            "subsumed": list(self.subsumed),
        }


def _takes_part(f: Finding) -> bool:
    return bool(f.fix and f.replaces and f.est_saving_s and f.est_saving_s > 0)


def combine(findings: Sequence[Finding], ctx: AuditContext) -> tuple[list[Finding], Combined]:
    """`findings` with overlapping ones marked, and what the counted fixes save together."""
    owner: dict[int, Finding] = {}  # trace position -> the counted fix that rewrites it
    counted: list[Finding] = []
    marks: dict[int, Finding] = {}
    for f in sorted(filter(_takes_part, findings), key=lambda f: -f.est_saving_s):
        clash = next((owner[i] for i in sorted(f.replaces) if i in owner), None)
        if clash is not None:
            marks[id(f)] = clash
            continue
        counted.append(f)
        owner.update(dict.fromkeys(f.replaces, f))
    costs = ctx.cost.ops
    step_s = sum(ctx.op_time_s(c) for c in costs)
    untouched_s = sum(ctx.op_time_s(c) for i, c in enumerate(costs) if i not in owner)
    instead_s = sum(max(ctx.time_s(_records(ctx, f)) - f.est_saving_s, 0.0) for f in counted)
    marked = [_mark(f, marks[id(f)]) if id(f) in marks else f for f in findings]
    combined = Combined(
        step_s=step_s,
        fixed_step_s=untouched_s + instead_s,
        fixes=tuple(f.label for f in counted),
        subsumed=tuple(f.label for f in marked if f.subsumed_by),
    )
    return marked, combined


def _mark(f: Finding, by: Finding) -> Finding:
    return dataclasses.replace(f, subsumed_by=by.label, inside=f.replaces <= by.replaces)


def _records(ctx: AuditContext, f: Finding):
    return [ctx.trace.ops[i] for i in sorted(f.replaces)]
