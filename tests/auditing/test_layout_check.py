"""nchw-conv held to the whole model traced in channels_last (auditing/layout_check.py): a
PoolFormer-style net, whose GroupNorms return NCHW whatever they are given, gets the finding as
info with both steps and the reason in its message; the same net with BatchNorm keeps its
finding as the rule priced it; and a saving the whole model only partly keeps is cut to it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import gpushape
from gpushape.auditing.finding import Finding, Severity
from gpushape.auditing.layout_check import checked_layout


class Block(nn.Module):
    """PoolFormer's block: a norm, a 3x3 average pool less its input, a norm, a 1x1 MLP."""

    def __init__(self, c: int, norm):
        super().__init__()
        self.norm1, self.norm2 = norm(c), norm(c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.fc1, self.act, self.fc2 = nn.Conv2d(c, 4 * c, 1), nn.GELU(), nn.Conv2d(4 * c, c, 1)

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.pool(y) - y
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


def _net(norm, c: int = 64) -> nn.Module:
    with torch.device("meta"):
        stem = nn.Conv2d(3, c, 7, 4, 2)
        return nn.Sequential(stem, Block(c, norm), Block(c, norm)).to(torch.bfloat16)


X = torch.empty(64, 3, 224, 224, device="meta", dtype=torch.bfloat16)


def _nchw_conv(model) -> Finding:
    report = gpushape.audit(model, (X,), "h200", train=True)
    return next(f for f in report.findings if f.rule == "nchw-conv")


def test_group_norms_that_return_nchw_make_the_finding_info():
    f = _nchw_conv(_net(lambda c: nn.GroupNorm(1, c)))
    assert f.severity == Severity.INFO and f.est_saving_s == 0
    assert f.evidence["rule_saving_s"] > 0  # what the rule alone had priced
    steps = f.evidence["whole_model_gpu_s"]
    assert steps["channels_last"] > steps["nchw"]
    assert f.evidence["return_nchw"] == ["GroupNorm"]
    assert "GroupNorm returns NCHW" in f.message and "leave the layout as it is" in f.message


def test_batch_norms_keep_the_finding_as_the_rule_priced_it():
    f = _nchw_conv(_net(nn.BatchNorm2d))
    assert f.severity > Severity.INFO and f.est_saving_s > 0
    assert "whole_model_gpu_s" not in f.evidence and "rule_saving_s" not in f.evidence


class _Ctx:
    """What checked_layout reads of an audit context: a step time, and a trace and costs."""

    def __init__(self, gpu_s: float):
        self.gpu_s, self.step_time_s = gpu_s, 0.1
        self.trace = dataclasses.make_dataclass("T", ["ops"])([])
        self.cost = dataclasses.make_dataclass("C", ["ops"])([])


def test_a_saving_the_whole_model_keeps_in_part_is_cut_to_it(monkeypatch):
    import gpushape.auditing.layout_check as lc

    monkeypatch.setattr(lc, "step_time", lambda ctx, mode: ctx)  # .gpu_s: the step's GPU time
    rule = Finding(
        rule="nchw-conv", severity=Severity.HIGH, module="conv", message="m",
        est_saving_s=0.010, fix="channels-last", evidence={},
    )  # fmt: skip
    other = Finding(rule="x", severity=Severity.LOW, module="y", message="", est_saving_s=1e-4)
    (cut, kept) = checked_layout([rule, other], _Ctx(0.100), lambda: _Ctx(0.096), "eager")
    assert cut.est_saving_s == pytest.approx(0.004) and cut.severity == Severity.MEDIUM
    assert "0.004 ms" not in cut.message and "4.000 ms reach the step" in cut.message
    assert kept is other
    (same,) = checked_layout([rule], _Ctx(0.100), lambda: _Ctx(0.091), "eager")  # 0.9 of it
    assert same is rule
    assert checked_layout([rule], _Ctx(0.100), lambda: None, "eager") == [rule]
