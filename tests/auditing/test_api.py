"""`gpushape.audit(...)`: the Python entry point, and what it leaves alone."""

from __future__ import annotations

import json

import torch

import gpushape
from gpushape.auditing.finding import Finding, Severity

from .models import ConvBN


def test_top_level_audit_returns_a_report(tmp_path):
    model = ConvBN(cin=63, bias=True)  # fp32 on the CPU: audited as a bf16 meta copy
    x = torch.randn(4, 63, 32, 32)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2)
    report = gpushape.audit(
        model, (x,), gpu="h100", dtype=torch.bfloat16, train=True, dataloader=loader
    )
    assert report.dtype == "bf16" and report.train and report.layers
    assert report.totals.flops > 0
    rules = {f.rule for f in report.findings}
    assert {"conv-bias-before-bn", "nchw-conv", "dataloader", "tc-align"} <= rules
    assert all(isinstance(f, Finding) for f in report.findings)
    assert json.loads(report.to_json())["findings"]
    assert "## Findings" in report.to_markdown()
    page = tmp_path / "r.html"
    report.to_html(page)
    assert page.stat().st_size > 10_000
    # the model itself was not cast, moved or changed
    assert model.conv.weight.dtype == torch.float32 and model.conv.weight.device.type == "cpu"


def test_severity_parse_and_order():
    assert Severity.parse("HIGH") > Severity.parse("medium") > Severity.LOW > Severity.INFO
