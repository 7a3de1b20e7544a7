"""Findings as a terminal table (rich), printed above the per-layer table.

Sorted by estimated saving (largest first); findings without a time estimate follow, by
severity; info findings come last: they explain what is not worth changing on this chip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..finding import Finding, Severity
from ..fixes import describe
from .header import header_text

SEVERITY_STYLE = {
    Severity.HIGH: "bold red",
    Severity.MEDIUM: "yellow",
    Severity.LOW: "cyan",
    Severity.INFO: "dim",
}


def saving_text(f: Finding, step_s: float) -> str:
    if f.est_saving_s is None:
        freed = f.evidence.get("freed_bytes")
        return f"{freed / 1e9:,.1f} GB" if freed else "-"
    share = f" ({f.est_saving_s / step_s:.1%})" if step_s > 0 else ""
    return f"{f.est_saving_s * 1e3:,.3f} ms{share}"


def module_text(f: Finding) -> str:
    return f.module or "(model)"


def headline(report: Any) -> str:
    """The report's header, plain text (escape it for rich): model, inputs, dtype, step, the
    chip and why it was chosen, predicted time; then where the chip's numbers came from."""
    return header_text(report)


def render_findings(
    findings: Sequence[Finding], step_s: float, console: Console, title: str
) -> None:
    if not findings:
        console.print(
            f"{title}\nno findings: nothing in this design wastes the chip that the rules can see",
            highlight=False,
        )
        return
    table = Table(title=title, title_justify="left", show_lines=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("est. saving / step", justify="right", no_wrap=True)
    table.add_column("finding (rule, module, fix) and why", overflow="fold", ratio=1)
    for f in findings:
        style = SEVERITY_STYLE[f.severity]
        fix = f" [dim]fix:[/] {f.fix}" if f.fix else ""
        table.add_row(
            f"[{style}]{f.severity.label}[/]",
            saving_text(f, step_s),
            f"[bold]{f.rule}[/] [magenta]{escape(module_text(f))}[/]{fix}\n{escape(f.message)}",
        )
    console.print(table)
    fixes = sorted({f.fix for f in findings if f.fix})
    if fixes:
        console.print(
            "fixes (transforms arrive with `gpushape optimize` in a later release): "
            + "; ".join(f"{fix}: {describe(fix)}" for fix in fixes),
            highlight=False,
            style="dim",
        )


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Findings above info first, by saving; then info."""
    return sorted(findings, key=lambda f: (f.severity == Severity.INFO, *f.sort_key))
