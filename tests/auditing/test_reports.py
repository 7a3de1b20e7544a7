"""The report's four faces: schema-1 JSON with findings, Markdown, the terminal table, and one
self-contained HTML page that a browser renders with its roofline plot."""

from __future__ import annotations

import json
import re

import pytest

from gpushape.auditing import audit
from gpushape.auditing.finding import Severity
from gpushape.auditing.registry import load_rules
from gpushape.auditing.report.render import ordered
from gpushape.auditing.report.roofline import ROOF_COLOR
from gpushape.models import create_model

RULES = set(load_rules())
FINDING_KEYS = {"rule": str, "severity": str, "module": str, "message": str, "evidence": dict}


@pytest.fixture(scope="module")
def bert_report():
    model, inputs = create_model("bert-base", attention="manual", batch=2, seq_len=256)
    return audit(model, inputs, gpu="h200", train=True)


def test_json_is_schema_1_with_findings(bert_report):
    doc = json.loads(bert_report.to_json())
    assert doc["schema"] == 1
    assert (doc["gpu"], doc["dtype"], doc["train"]) == ("h200-sxm", "bf16", True)
    for key in ("flops", "min_bytes", "roofline_time_s", "ops"):
        assert key in doc["totals"]
    assert doc["findings"], "the textbook BERT has findings"
    for f in doc["findings"]:
        for key, kind in FINDING_KEYS.items():
            assert isinstance(f[key], kind), (key, f)
        assert f["severity"] in ("high", "medium", "low", "info")
        assert f["est_saving_s"] is None or isinstance(f["est_saving_s"], float)
        assert f["fix"] is None or isinstance(f["fix"], str)
        assert f["evidence"]["numbers"].startswith(("datasheet", "calibrated"))


def test_markdown_lists_findings_and_layers(bert_report):
    text = bert_report.to_markdown(show_all=True)
    assert text.startswith("# gpushape audit: ")
    assert "## Findings" in text and "## Top" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    finding_rows = [row for row in rows if row.split("|")[2].strip() in RULES]
    expected = [(f.severity.label, f.rule) for f in ordered(bert_report.findings)]
    assert [
        (row.split("|")[1].strip(), row.split("|")[2].strip()) for row in finding_rows
    ] == expected
    assert "`sdpa`" in text  # the fixes are described
    quiet = bert_report.to_markdown()  # info findings (saving nothing worth it) hidden
    hidden = [f for f in bert_report.findings if f.severity == Severity.INFO]
    assert ("--all shows them" in quiet) == bool(hidden)


def test_terminal_table_sorts_by_saving(bert_report):
    from rich.console import Console

    console = Console(width=160, record=True)
    bert_report.render(console)
    out = console.export_text()
    shown = [f for f in ordered(bert_report.findings) if f.severity > Severity.INFO]
    positions = [out.index(f"{f.rule} {f.module}") for f in shown]
    assert positions == sorted(positions)
    savings = [f.est_saving_s for f in shown if f.est_saving_s is not None]
    assert savings == sorted(savings, reverse=True)
    assert positions[-1] < out.index("top 15 modules")


def test_html_is_one_self_contained_file(bert_report, tmp_path):
    path = tmp_path / "report.html"
    page = bert_report.to_html(path, show_all=True)
    assert path.read_text(encoding="utf-8") == page
    assert re.search(r"src='data:image/png;base64,[A-Za-z0-9+/=]{1000,}'", page)
    assert not re.search(r"(src|href)=['\"]https?:", page)
    for f in bert_report.findings:
        assert f.rule in page


@pytest.mark.chromium
def test_html_renders_in_headless_chromium(bert_report, tmp_path, chromium_screenshot):
    import numpy as np
    from matplotlib.image import imread

    path = tmp_path / "report.html"
    bert_report.to_html(path)
    pixels = imread(chromium_screenshot(path))[..., :3]  # (H, W, 3) floats in [0, 1]
    assert pixels.std() > 0.05, "the screenshot is blank"
    roof = np.array([int(ROOF_COLOR[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    near_roof = np.abs(pixels - roof).max(axis=-1) < 0.05
    assert near_roof.sum() > 500, "the roofline plot's roofs are not on the page"
