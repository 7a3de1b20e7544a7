"""The audit report as one self-contained HTML page: the roofline plot (a PNG embedded as
base64), the findings (largest saving first, evidence folded) and the per-layer table. No
scripts, no external files."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

from ...errors import GpushapeError
from ..finding import Severity
from ..fixes import describe
from ..modes import predicted_step_s
from .render import (
    combined_text,
    headline,
    hidden_text,
    module_text,
    saving_text,
    subsumed_text,
    visible,
)
from .roofline import roofline_png

SEVERITY_COLORS = {
    Severity.HIGH: "#c0392b",
    Severity.MEDIUM: "#d68910",
    Severity.LOW: "#2471a3",
    Severity.INFO: "#7f8c8d",
}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; width: 100%; margin: 1em 0; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f4f4f4; } td.num { text-align: right; white-space: nowrap; }
.sev { color: white; border-radius: 3px; padding: 1px 6px; font-weight: 600; }
code { font-size: 13px; } img { max-width: 100%; border: 1px solid #eee; }
"""


def _short(value: Any) -> str:
    """Evidence values for reading: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def _findings_html(report: Any, show_all: bool) -> str:
    findings, hidden = visible(report.findings, show_all)
    notes = "".join(
        f"<p>{escape(line)}</p>" for line in (combined_text(report), hidden_text(hidden)) if line
    )
    if not findings:
        none = "<p>No findings: nothing in this design wastes the chip that the rules see.</p>"
        return none + notes
    rows = []
    for f in findings:
        evidence = ", ".join(
            f"{escape(str(k))}={escape(_short(v))}" for k, v in f.evidence.items() if k != "numbers"
        )
        fix = f"<code title='{escape(describe(f.fix))}'>{escape(f.fix)}</code>" if f.fix else "-"
        rows.append(
            f"<tr><td><span class='sev' style='background:{SEVERITY_COLORS[f.severity]}'>"
            f"{f.severity.label}</span></td><td>{escape(f.rule)}</td>"
            f"<td><code>{escape(module_text(f))}</code></td>"
            f"<td class='num'>{escape(saving_text(f, predicted_step_s(report)))}"
            f"<br><small>{escape(subsumed_text(f))}</small></td>"
            f"<td>{fix}</td><td>{escape(f.message)}<details><summary>evidence</summary>"
            f"<small>{evidence}</small></details></td></tr>"
        )
    return (
        "<table><tr><th>severity</th><th>rule</th><th>module</th><th>est. saving / step"
        "</th><th>fix</th><th>what and why (evidence)</th></tr>"
        + "".join(rows)
        + "</table>"
        + notes
        + _fixes_html(findings)
    )


def _fixes_html(findings: list) -> str:
    fixes = sorted({f.fix for f in findings if f.fix})
    items = "".join(f"<li><code>{escape(x)}</code>: {escape(describe(x))}</li>" for x in fixes)
    return (
        f"<p><small>Fixes (<code>gpushape optimize</code> applies those it has a transform "
        f"for):</small></p><ul><small>{items}</small></ul>"
        if fixes
        else ""
    )


def _layers_html(report: Any, top: int) -> str:
    total = report.totals.roofline_time_s or 1.0
    rows = []
    for x in report.layers[:top]:
        rows.append(
            f"<tr><td><code>{escape(x.module or '(root)')}</code></td>"
            f"<td>{escape(x.op.split('.')[1] if x.op.count('.') >= 2 else x.op)}</td>"
            f"<td>{x.phase}</td><td class='num'>{x.flops / 1e9:,.3f}</td>"
            f"<td class='num'>{x.min_bytes / 1e6:,.1f}</td>"
            f"<td class='num'>{x.intensity:,.1f}</td><td>{x.bound}</td>"
            f"<td class='num'>{x.roofline_time_s * 1e3:,.3f}</td>"
            f"<td class='num'>{x.roofline_time_s / total:.1%}</td></tr>"
        )
    return (
        "<table><tr><th>module</th><th>op</th><th>phase</th><th>GFLOP</th><th>MB</th>"
        "<th>FLOP/B</th><th>bound</th><th>predicted ms</th><th>share</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def to_html(
    report: Any, path: str | Path | None = None, *, top: int = 40, show_all: bool = False
) -> str:
    png = base64.b64encode(roofline_png(report)).decode("ascii")
    t = report.totals
    head = "<br>".join(escape(line) for line in headline(report).splitlines())
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>gpushape audit: {escape(report.model)}</title><style>{STYLE}</style></head>"
        f"<body><h1>gpushape audit: {escape(report.model)}</h1><p>{head}</p>"
        f"<p>FLOPs {t.flops / 1e9:,.2f} G (a multiply-add counts 2), minimum bytes "
        f"{t.min_bytes / 1e9:,.3f} GB, {t.ops} ops, {t.kernels} kernels: GPU "
        f"{t.kernel_time_s * 1e3:,.3f} ms + launches {t.launch_s * 1e3:,.3f} ms.</p>"
        f"<h2>Roofline</h2><img alt='roofline plot' src='data:image/png;base64,{png}'>"
        f"<h2>Findings</h2>{_findings_html(report, show_all)}"
        f"<h2>Top {min(top, len(report.layers))} layers by predicted time</h2>"
        f"{_layers_html(report, top)}</body></html>"
    )
    if path is not None:
        try:
            Path(path).write_text(page, encoding="utf-8")
        except OSError as exc:
            raise GpushapeError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    return page
