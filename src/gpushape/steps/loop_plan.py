"""Which fixes the fix-by-fix loop (`fix_by_fix.loop`) times, in what order, and at how many
places: read from optimize's report of a planning copy and from the stages it built."""

from __future__ import annotations

from typing import Any

GRAPH_LAYERS = "graph-layers"  # kept by optimize on a timing; its stage priced in graph mode
# fixes graph-layers needs in place before it captures anything: no-kv-cache (a layer called
# with a key/value cache is refused: a replay would not update the cache)
BEFORE_GRAPH_LAYERS = ("no-kv-cache",)
# correctness guards, not fixes: no stage of their own. optimize puts safe-avg-pool in place
# unasked, first, wherever the device has pytorch#188344 (transforms/safe_avg_pool.py), so
# every stage's optimize carries it; it costs only where a pool's input is channels_last, so
# its cost shows in the stage whose fix made that input channels_last
GUARDS = ("safe-avg-pool",)


def applied_order(report: Any) -> list[str]:
    """The transforms optimize applied, in its order (guards left out: `GUARDS`), except
    graph-layers first: it changes what the host spends, not the GPU's work, so with it in
    place the fixes after it are timed where their GPU savings show in the wall clock (a
    host-bound step would hide them), which is what the audit prices them as."""
    seen: list[str] = []
    for change in report.applied if report else []:
        if change.transform not in seen and change.transform not in GUARDS:
            seen.append(change.transform)
    if GRAPH_LAYERS in seen:
        first = [t for t in seen if t in BEFORE_GRAPH_LAYERS]
        seen = first + [GRAPH_LAYERS] + [t for t in seen if t not in (*first, GRAPH_LAYERS)]
    return seen


def disputed(optimize_report: Any, audit_report: Any) -> list[str]:
    """Fixes of high or medium findings that optimize rolled back as predicted slower (its
    audit of the whole rewritten step saw costs the finding's own pricing does not): the loop
    applies them by name after the others, so the step timed says which of the two was right.
    Not ones rolled back for failing their numeric check."""
    from ..auditing.finding import Severity

    if optimize_report is None:
        return []
    named = {f.fix for f in audit_report.findings if f.fix and f.severity >= Severity.MEDIUM}
    return [
        r.transform
        for r in optimize_report.rolled_back
        if r.transform in named and r.reason.startswith("predicted slower")
    ]


def left_out(plan: Any, report: Any, timed: list[str]) -> dict[str, str]:
    """fix -> why the loop does not time it: each high or medium finding's fix not in `timed`
    (what the planning copy's optimize applied, and the step's own fixes), with what that
    optimize's report says of it (rolled back, refused, skipped; the first reason), or that it
    said nothing. (ResNet-50-GN's loop on an H100 left channels-last out, a medium finding,
    and its JSON did not say why: benchmarks/results/loops-h100-28.)"""
    from ..auditing.finding import Severity

    named = [f.fix for f in report.findings if f.fix and f.severity >= Severity.MEDIUM]
    out: dict[str, str] = {}
    for fix in dict.fromkeys(named):
        if fix in timed:
            continue
        why = "optimize's report names no reason"
        for kind in ("rolled_back", "refused", "skipped"):
            said = [r for r in getattr(plan, kind, ()) if r.transform == fix]
            if said:
                why = f"{kind.replace('_', ' ')}: {said[0].reason}"
                break
        out[fix] = why
    return out


def applied_count(report: Any, tid: str) -> int:
    """How many places optimize's `report` rewrote with `tid`."""
    return sum(c.transform == tid for c in report.applied) if report is not None else 0


def places(planned: dict[str, int], built: dict[str, Any]) -> dict[str, int]:
    """Where each applied fix rewrote the model: the planning copy's count (`planned`), or for
    a fix applied by name after optimize rolled it back there (`disputed`), the count in the
    report of the stage that added it (the BERT loop of 2026-12-06 showed fuse-qkv at 0 places
    where it had fused all 12 layers)."""
    out = dict(planned)
    for tid, n in planned.items():
        stage = built.get(f"+ {tid}")
        if not n and stage is not None:
            out[tid] = applied_count(getattr(stage, "optimize_report", None), tid)
    return out
