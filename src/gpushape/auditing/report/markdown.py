"""The audit report as Markdown: headline, findings (largest saving first), top layers."""

from __future__ import annotations

from typing import Any

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


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _findings(report: Any, show_all: bool) -> list[str]:
    findings, hidden = visible(report.findings, show_all)
    notes = [line for line in (combined_text(report), hidden_text(hidden)) if line]
    if not findings:
        none = "No findings: nothing in this design wastes the chip that the rules can see."
        return [none, *notes]
    step_s = predicted_step_s(report)
    lines = [
        "| severity | rule | module | est. saving / step | fix | what and why |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    for f in findings:
        lines.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    f.severity.label,
                    f.rule,
                    f"`{module_text(f)}`",
                    " ".join(filter(None, (saving_text(f, step_s), subsumed_text(f)))),
                    f.fix or "-",
                    f.message,
                )
            )
            + " |"
        )
    lines += ["", *notes] if notes else []
    fixes = sorted({f.fix for f in findings if f.fix})
    if fixes:
        lines += ["", "Fixes (`gpushape optimize` applies those it has a transform for):"]
        lines += [f"- `{fix}`: {describe(fix)}" for fix in fixes]
    return lines


def _layers(report: Any, top: int) -> list[str]:
    total_s = report.totals.roofline_time_s or 1.0
    lines = [
        "| module | op | phase | GFLOP | MB | FLOP/B | bound | predicted ms | share |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for layer in report.layers[:top]:
        op = layer.op.split(".")[1] if layer.op.count(".") >= 2 else layer.op
        lines.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    f"`{layer.module or '(root)'}`",
                    op,
                    layer.phase,
                    f"{layer.flops / 1e9:,.3f}",
                    f"{layer.min_bytes / 1e6:,.1f}",
                    f"{layer.intensity:,.1f}",
                    layer.bound,
                    f"{layer.roofline_time_s * 1e3:,.3f}",
                    f"{layer.roofline_time_s / total_s:.1%}",
                )
            )
            + " |"
        )
    return lines


def to_markdown(report: Any, *, top: int = 20, show_all: bool = False) -> str:
    t = report.totals
    lines = [
        f"# gpushape audit: {report.model}",
        "",
        headline(report).replace("\n", "  \n"),  # a Markdown line break between its lines
        "",
        f"- FLOPs: {t.flops / 1e9:,.2f} G (a multiply-add counts 2); minimum bytes: "
        f"{t.min_bytes / 1e9:,.3f} GB; ops: {t.ops}",
        f"- predicted step: {t.roofline_time_s * 1e3:,.3f} ms "
        f"(GPU {t.kernel_time_s * 1e3:,.3f} ms + launches {t.launch_s * 1e3:,.3f} ms)",
        "",
        "## Findings",
        "",
        *_findings(report, show_all),
        "",
        f"## Top {min(top, len(report.layers))} layers by predicted time",
        "",
        *_layers(report, top),
        "",
    ]
    return "\n".join(lines)
