"""`gpushape audit` with findings: --format md|html, --fail-on exit codes, calibrated profiles,
and every bad input as one line and exit 2."""

from __future__ import annotations

import json

import pytest

from gpushape.cli.main import main

# A zoo model at a batch where the GPU sets the pace (at batch 2 its inference step is
# launch-bound and channels-last saves no wall-clock time): ResNet-50 at batch 64, inference.
RESNET = ["audit", "resnet50", "--batch", "64"]


def _fails(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpushape: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_table_shows_findings_before_layers(capsys):
    assert main(RESNET) == 0
    out = capsys.readouterr().out
    assert "nchw-conv" in out and "channels-last" in out
    assert out.index("nchw-conv") < out.index("predicted ms")


def test_fail_on_gates_ci(capsys):
    """ResNet-50 in NCHW has a high finding: --fail-on high exits 1; channels_last-clean
    models pass. A low threshold catches at least what a high one does."""
    assert main([*RESNET, "--fail-on", "high", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any(f["severity"] == "high" for f in doc["findings"])
    assert main([*RESNET, "--fail-on", "low", "--format", "json"]) == 1
    capsys.readouterr()


def test_fail_on_passes_when_nothing_reaches_it(capsys, tmp_path):
    clean = tmp_path / "clean.py"
    clean.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make(batch=8):\n"
        "    return nn.Linear(4096, 4096), (torch.randn(8192, 4096),)\n"
    )
    assert main(["audit", f"{clean}:make", "--fail-on", "medium"]) == 0
    capsys.readouterr()


def test_markdown_and_html_files(capsys, tmp_path):
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    assert main([*RESNET, "--format", "md", "-o", str(md)]) == 0
    assert main([*RESNET, "--format", "html", "-o", str(html)]) == 0
    assert md.read_text().startswith("# gpushape audit: resnet50") and "nchw-conv" in md.read_text()
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    assert capsys.readouterr().out == ""


def test_unknown_severity(capsys):
    err = _fails(capsys, [*RESNET, "--fail-on", "severe"])
    assert "unknown severity 'severe'" in err and "high, medium or low" in err


def test_info_is_not_a_gate(capsys):
    assert "info" in _fails(capsys, [*RESNET, "--fail-on", "info"])


def test_unreadable_profile(capsys, tmp_path):
    assert "cannot read profile" in _fails(
        capsys, [*RESNET, "--profile", str(tmp_path / "none.json")]
    )
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in _fails(capsys, [*RESNET, "--profile", str(bad)])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["audit", "resnet51"], "unknown model"),
        (["audit", "resnet50", "--input", "8xZx224"], "bad --input"),  # no --batch with it
        ([*RESNET, "--gpu", "h300"], "unknown GPU"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, says):
    assert says in _fails(capsys, argv)
