"""optimize's picking (transforms/_picking.py): a fix the audit of the model as given held back
because ops in it return NCHW (nchw-conv's `return_nchw`) is looked at again once the other
fixes are in, and applied where the audit of the rewritten model says it pays."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from gpushape.auditing.finding import Severity
from gpushape.transforms import optimize
from gpushape.transforms._picking import held_back, now_worth


def _finding(rule, fix, saving, severity=Severity.MEDIUM, **evidence):
    return SimpleNamespace(
        rule=rule, fix=fix, est_saving_s=saving, severity=severity, module="", evidence=evidence
    )


HELD = _finding("nchw-conv", "channels-last", 0.0, Severity.INFO, return_nchw=["GroupNorm"])
NORMS = _finding("slow-group-norm", "fuse-group-norm", 2e-3)


def test_held_back_is_channels_last_priced_at_nothing_because_ops_return_nchw():
    report = SimpleNamespace(findings=[HELD, NORMS])
    assert held_back(report, ["fuse-group-norm"]) == ["channels-last"]
    assert held_back(report, ["fuse-group-norm", "channels-last"]) == []  # picked already
    paying = _finding("nchw-conv", "channels-last", 1e-3, return_nchw=["GroupNorm"])
    assert held_back(SimpleNamespace(findings=[paying]), []) == []  # worth it: picked
    plain = _finding("nchw-conv", "channels-last", 0.0, Severity.INFO)
    assert held_back(SimpleNamespace(findings=[plain]), []) == []  # no op turned it back


def test_now_worth_sums_the_rewritten_models_findings():
    again = [_finding("nchw-conv", "channels-last", 4e-4), _finding("x", "channels-last", 1e-4)]
    report = SimpleNamespace(findings=[*again, NORMS, HELD])
    assert now_worth(report, ["channels-last"]) == {"channels-last": 5e-4}
    assert now_worth(SimpleNamespace(findings=[HELD]), ["channels-last"]) == {}


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.out = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.conv(x))))


def test_optimize_applies_channels_last_once_the_norms_keep_the_layout(monkeypatch):
    """The audits stand in: the model as given has the norms' finding and channels-last held
    back; after fuse-group-norm, the audit of the rewritten model finds converting pays."""
    import gpushape.auditing.api as api

    audits = []

    def fake_audit(model, *args, **kwargs):
        swapped = type(model.norm).__name__ != "GroupNorm"
        findings = [NORMS, HELD] if not swapped else [
            _finding("nchw-conv", "channels-last", 3e-4, return_nchw=[])
        ]  # fmt: skip
        audits.append(swapped)
        step = SimpleNamespace(gpu_s=1e-2 - 1e-3 * len(audits), wall_s=1e-2 - 1e-3 * len(audits))
        return SimpleNamespace(findings=findings, step=step, model="net", gpu="h100",
                               gpu_spec=None, totals=None)  # fmt: skip

    monkeypatch.setattr(api, "audit", fake_audit)
    model, x = _Net().train(), torch.randn(2, 3, 8, 8)
    model, report = optimize(model, (x,), "h100", train=True)
    done = [c.transform for c in report.applied]
    assert "fuse-group-norm" in done and "channels-last" in done
    assert report.predicted_saving_s["channels-last"] == 3e-4
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    # as given, nothing held back: one audit before, one a fix (the guard's), one after
    monkeypatch.setattr(api, "audit", lambda m, *a, **k: SimpleNamespace(
        findings=[NORMS], step=SimpleNamespace(gpu_s=1e-2, wall_s=1e-2), model="net",
        gpu="h100", gpu_spec=None, totals=None))  # fmt: skip
    _, plain = optimize(_Net().train(), (x,), "h100", train=True)
    assert "channels-last" not in [c.transform for c in plain.applied]
