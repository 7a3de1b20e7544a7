"""Findings as a terminal table (rich), printed above the per-layer table.

Sorted by estimated saving (largest first); findings without a time estimate follow, by
severity; info findings come last: they explain what is not worth changing on this chip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..finding import Finding, Severity
from ..fixes import describe
from ..modes import predicted_step_s
from .header import header_text

SEVERITY_STYLE = {
    Severity.HIGH: "bold red",
    Severity.MEDIUM: "yellow",
    Severity.LOW: "cyan",
    Severity.INFO: "dim",
}


def saving_text(f: Finding, step_s: float) -> str:
    """The GPU time a finding saves (and its share of the step), and the wall-clock time it
    saves in the audited mode where that differs by more than WALL_DIFFERS."""
    if f.est_saving_s is None:
        freed = f.evidence.get("freed_bytes")
        return f"{freed / 1e9:,.1f} GB" if freed else "-"
    share = f" ({f.est_saving_s / step_s:.1%})" if step_s > 0 else ""
    text = f"{f.est_saving_s * 1e3:,.3f} ms{share}"
    wall = f.evidence.get("wall_saving_s")
    if isinstance(wall, (int, float)) and abs(wall - f.est_saving_s) > WALL_DIFFERS * max(
        abs(f.est_saving_s), 1e-9
    ):
        text += f", wall {wall * 1e3:,.3f} ms"
    return text


WALL_DIFFERS = 0.05  # show the wall-clock saving beside the GPU's when they differ this much


def module_text(f: Finding) -> str:
    return f.module or "(model)"


def headline(report: Any) -> str:
    """The report's header, plain text (escape it for rich): model, inputs, dtype, step, the
    chip and why it was chosen, predicted time; then where the chip's numbers came from."""
    return header_text(report)


def visible(findings: Sequence[Finding], show_all: bool) -> tuple[list[Finding], int]:
    """The findings to show, ordered, and how many info findings (savings below 0.1 % of the
    step, or none on this chip) were left out; `show_all` keeps every one."""
    shown = ordered(f for f in findings if show_all or f.severity != Severity.INFO)
    return shown, len(findings) - len(shown)


def subsumed_text(f: Finding) -> str:
    """Why a finding's saving is not in the combined total."""
    if not f.subsumed_by:
        return ""
    if f.inside:
        return f"inside {f.subsumed_by}'s fix: not added"
    return f"overlaps {f.subsumed_by}, counted instead"


def combined_text(report: Any) -> str:
    """One line: what the non-overlapping fixes save together, costed on the fixed step."""
    c = report.combined
    if c is None or not c.fixes:
        return ""
    step_s = predicted_step_s(report)
    share = f" ({c.saving_s / step_s:.1%} of the step)" if step_s > 0 else ""
    inside = f"; {len(c.subsumed)} marked finding(s) are inside them" if c.subsumed else ""
    return (
        f"Together: {len(c.fixes)} non-overlapping fix(es) save {c.saving_s * 1e3:,.3f} ms"
        f"{share}, the fixed step costed once{inside}."
    )


def hidden_text(hidden: int) -> str:
    if not hidden:
        return ""
    return f"{hidden} info finding(s) that save nothing worth a change hidden; --all shows them."


def render_findings(report: Any, console: Console, *, show_all: bool = False) -> None:
    findings, hidden = visible(report.findings, show_all)
    title = headline(report)
    step_s = predicted_step_s(report)
    if not findings:
        console.print(escape(title), highlight=False)
        console.print(
            "no findings: nothing in this design wastes the chip that the rules can see",
            highlight=False,
        )
    else:
        table = Table(title=escape(title), title_justify="left", show_lines=True)
        table.add_column("severity", no_wrap=True)
        table.add_column("est. saving / step", justify="right", no_wrap=True)
        table.add_column("finding (rule, module, fix) and why", overflow="fold", ratio=1)
        for f in findings:
            style = SEVERITY_STYLE[f.severity]
            fix = f" [dim]fix:[/] {escape(f.fix)}" if f.fix else ""
            saving = escape(saving_text(f, step_s))
            note = ""
            if f.subsumed_by:  # a label can be long: it folds with the message, not the number
                saving = f"[dim]{saving}[/]"
                note = f"\n[dim]{escape(subsumed_text(f))}[/]"
            table.add_row(
                f"[{style}]{f.severity.label}[/]",
                saving,
                f"[bold]{escape(f.rule)}[/] [magenta]{escape(module_text(f))}[/]{fix}\n"
                f"{escape(f.message)}{note}",
            )
        console.print(table)
    for line in (combined_text(report), hidden_text(hidden)):
        if line:
            console.print(escape(line), highlight=False)
    fixes = sorted({f.fix for f in findings if f.fix})
    if fixes:
        console.print(
            escape(
                "fixes (`gpushape optimize` applies those it has a transform for): "
                + "; ".join(f"{fix}: {describe(fix)}" for fix in fixes)
            ),
            highlight=False,
            style="dim",
        )


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Findings above info first, by saving; then info."""
    return sorted(findings, key=lambda f: (f.severity == Severity.INFO, *f.sort_key))
