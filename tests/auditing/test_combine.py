"""Overlapping findings: savings that do not add are marked, and the fixes' combined saving is
costed once on the fixed step, so it never exceeds the step."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

import gpushape
from gpushape.auditing.combine import combine
from gpushape.auditing.finding import Finding, Severity

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "audit_attention.py"


def _hand_written_block():
    spec = importlib.util.spec_from_file_location("gpushape_example_attention", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HandWrittenBlock(max_len=512).to(torch.bfloat16)


@pytest.fixture(scope="module")
def attention_report():
    # batch 32: the GPU's work outlasts the host's dispatch (smaller, the step is host-bound
    # and launch-bound's CUDA graph takes every op, leaving the two fusions nothing to count)
    x = torch.empty(32, 512, 768, device="meta", dtype=torch.bfloat16, requires_grad=True)
    return gpushape.audit(_hand_written_block(), (x,), gpu="h200", train=True)


def test_hand_written_attention_combined_saving_at_most_the_step(attention_report):
    r = attention_report
    by_rule = {f.rule: f for f in r.findings}
    both = [by_rule["manual-attention"], by_rule["unfused-softmax-dropout"]]
    marked = [f for f in both if f.subsumed_by]
    assert len(marked) == 1, "exactly one of the two overlapping fixes is counted"
    counted = next(f for f in both if not f.subsumed_by)
    assert marked[0].subsumed_by == counted.label
    c = r.combined
    assert counted.label in c.fixes and marked[0].label in c.subsumed
    assert 0 < c.saving_s <= r.totals.roofline_time_s
    assert c.saving_s < sum(f.est_saving_s for f in r.findings if f.est_saving_s)


def test_marks_reach_every_format(attention_report):
    doc = json.loads(attention_report.to_json())
    assert doc["combined"]["saving_s"] == pytest.approx(attention_report.combined.saving_s)
    marked = {f["rule"] for f in doc["findings"] if "subsumed_by" in f["evidence"]}
    assert len(marked & {"manual-attention", "unfused-softmax-dropout"}) == 1
    console = Console(record=True, width=160)
    attention_report.render(console)
    text = console.export_text()
    assert ("Together:" in text and "counted instead" in text) or "not added" in text
    assert "Together:" in attention_report.to_markdown()
    assert "Together:" in attention_report.to_html()


def test_info_findings_hidden_unless_all(attention_report):
    info = [f for f in attention_report.findings if f.severity == Severity.INFO]
    if not info:
        pytest.skip("this audit raised no info finding")
    quiet, loud = Console(record=True, width=200), Console(record=True, width=200)
    attention_report.render(quiet)
    attention_report.render(loud, show_all=True)
    assert "--all shows them" in quiet.export_text()
    assert "--all shows them" not in loud.export_text()


# ---- combine() on hand-made findings ------------------------------------------------------


class _Ctx:
    """The two things combine() reads: each op's time, and the trace's ops."""

    def __init__(self, times: list[float]):
        self.cost = type("C", (), {"ops": times})()
        self.trace = type("T", (), {"ops": list(range(len(times)))})()

    def op_time_s(self, c: float) -> float:
        return c

    def time_s(self, recs) -> float:
        return sum(self.cost.ops[i] for i in recs)


def _finding(rule: str, saving: float, ops: set[int], fix: str | None = "sdpa") -> Finding:
    return Finding(
        rule=rule,
        severity=Severity.HIGH,
        module="m",
        message="",
        est_saving_s=saving,
        fix=fix,
        replaces=frozenset(ops),
    )


def test_disjoint_fixes_add_and_overlapping_ones_do_not():
    ctx = _Ctx([1.0] * 10)
    a, b, c = _finding("a", 3.0, {0, 1, 2, 3}), _finding("b", 1.0, {2}), _finding("c", 2.0, {7, 8})
    marked, combined = combine([b, a, c], ctx)
    assert combined.saving_s == pytest.approx(5.0)  # a and c; b is inside a
    assert combined.fixed_step_s == pytest.approx(5.0)
    b_marked = next(f for f in marked if f.rule == "b")
    assert b_marked.subsumed_by == "a @ m" and b_marked.inside
    assert [f.rule for f in marked] == ["b", "a", "c"]  # order kept


def test_overlap_that_is_not_containment_is_marked_so():
    ctx = _Ctx([1.0] * 4)
    marked, _ = combine([_finding("a", 2.0, {0, 1}), _finding("b", 1.0, {1, 2})], ctx)
    b = next(f for f in marked if f.rule == "b")
    assert b.subsumed_by == "a @ m" and not b.inside


def test_a_saving_larger_than_its_ops_counts_only_its_ops():
    ctx = _Ctx([1.0, 1.0])
    _, combined = combine([_finding("a", 5.0, {0})], ctx)
    assert combined.saving_s == pytest.approx(1.0) and combined.fixed_step_s == pytest.approx(1.0)


def test_findings_without_fix_or_ops_stay_out():
    ctx = _Ctx([1.0] * 3)
    advice = _finding("advice", 1.0, {0}, fix=None)
    memory = Finding(rule="mem", severity=Severity.LOW, module="", message="", fix="x")
    marked, combined = combine([advice, memory], ctx)
    assert combined.saving_s == 0 and not combined.fixes and marked == [advice, memory]


def test_a_long_overlap_label_folds_with_the_message_not_the_saving(attention_report):
    """A marked finding names the finding counted instead, whose module pattern can run to a
    line of its own: it folds in the finding's column; the saving column stays as wide as its
    numbers (it once took the whole width, and the messages two characters a line)."""
    import dataclasses

    long = "nchw-conv @ " + ", ".join(f"stages.{i}.blocks.*.mlp.fc*" for i in range(8))
    report = dataclasses.replace(
        attention_report,
        findings=[
            dataclasses.replace(f, subsumed_by=long) if f.subsumed_by else f
            for f in attention_report.findings
        ],
    )
    assert any(f.subsumed_by == long for f in report.findings)
    console = Console(record=True, width=100)
    report.render(console)
    text = console.export_text()
    assert "stages.7.blocks" in text  # the label, all of it
    header = next(line for line in text.splitlines() if "est. saving / step" in line)
    assert len(header.split("┃")[2]) < 40  # the saving column: its numbers' width
