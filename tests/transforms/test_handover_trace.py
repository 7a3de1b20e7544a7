"""The meta trace of a fused ResNet-style model records the backward as the eager GPU step runs
it: where a fused norm's output gradient arrives in two parts (the next block's residual and
its first convolution, or its downsampling branch), autograd's add is gone and the norm's
backward reads both (`tracing/handover.py`)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpushape.tracing import handover
from gpushape.tracing.cost import cost
from gpushape.tracing.tracer import trace
from gpushape.transforms import TransformContext, get_transform

from .nets import ConvNet


def _fused(model: nn.Module, x: torch.Tensor) -> nn.Module:
    outcome = get_transform("fuse-norm-act").apply(model, TransformContext(example_inputs=(x,)))
    return outcome.root or model


def _adds(t) -> list[str]:
    return [r.module for r in t.backward_ops() if r.op == handover.ADD]


def test_the_adds_between_fused_norms_are_gone_and_their_norms_read_both():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    model = _fused(ConvNet(), x)
    plain = trace(ConvNet(), x, train=True)
    t = trace(model, x, train=True)
    # ConvNet: the stem's output feeds block 0's conv1 and residual; block 0's output feeds
    # block 1's conv1 and downsampling branch: two adds in the plain model, none when fused
    assert len(_adds(plain)) == 2 and _adds(t) == []
    read_both = [r for r in t.ops if r.params.get("handed_over")]
    assert sorted(r.module for r in read_both) == ["blocks.0.bn3", "bn"]
    for r in read_both:
        assert r.input_names[:3] == ("dy", "dy2", "x")
        assert r.inputs[0].shape == r.inputs[1].shape == r.inputs[2].shape
    assert [r.index for r in t.ops] == list(range(len(t.ops)))
    for r in t.backward_ops():
        assert t.ops[r.fwd_index].phase == "forward"


def test_the_add_into_a_max_pool_stays():
    models = pytest.importorskip("torchvision.models")
    x = torch.randn(2, 3, 64, 64)
    model = _fused(models.resnet18(), x)
    t = trace(model, x, train=True)
    assert _adds(t) == ["layer1.0.conv1"]  # layer1's input is the max pool's output


def test_the_step_is_priced_without_the_adds(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(8, 3, 16, 16)
    model = _fused(ConvNet(c=32), x)
    handed = cost(trace(model, x, train=True), "h200")
    monkeypatch.setattr("gpushape.tracing.tracer.hand_overs", lambda ops: ops)
    added = cost(trace(model, x, train=True), "h200")

    def bytes_of(report, op):
        return sum(o.min_bytes for o in report.ops if o.op == op)

    bn = "gpushape.batch_norm_act_backward.default"
    one = 8 * 32 * 16 * 16 * 4  # one fp32 activation at the blocks' shape
    assert bytes_of(added, handover.ADD) - bytes_of(handed, handover.ADD) == 2 * 3 * one
    assert bytes_of(handed, bn) - bytes_of(added, bn) == 2 * one  # dy2, read once more
    assert sum(o.kernels for o in handed.ops) == sum(o.kernels for o in added.ops) - 2


def test_nothing_changes_without_a_fused_norm():
    x = torch.randn(2, 3, 8, 8)
    model = ConvNet()
    t = trace(copy.deepcopy(model), x, train=True)
    assert handover.hand_overs(t.ops) is t.ops


def test_the_audit_counts_the_adds_fusing_removes(monkeypatch):
    """unfused-norm-act on the plain model: the stem's BatchNorm -> ReLU output and the first
    block's output each have their gradient added from two users; fused, those adds are gone,
    and the finding's saving says so."""
    from gpushape.auditing.api import audit
    from gpushape.auditing.rules import unfused_norm_act

    torch.manual_seed(0)
    x = torch.randn(8, 3, 16, 16)

    def findings():
        report = audit(ConvNet(c=32), x, "h200", train=True)
        return {f.evidence["pattern"]: f for f in report.findings if f.rule == "unfused-norm-act"}

    with_adds = findings()
    counts = {p: f.evidence["handed_over_adds"] for p, f in with_adds.items()}
    # the stem's chain (F.relu) and block 0's residual chain; the blocks' inner chains none
    assert counts == {
        "BatchNorm2d->relu": 1,
        "BatchNorm2d->add_->relu_": 1,
        "BatchNorm2d->relu_": 0,
    }
    monkeypatch.setattr(unfused_norm_act, "handed_over_adds", lambda ctx, chains: [])
    without = findings()
    for pattern, f in with_adds.items():
        one = 8 * 32 * 16 * 16 * (2 if f.evidence["dtype"] == "bfloat16" else 4)  # a gradient
        more = f.evidence["bytes_saved"] - without[pattern].evidence["bytes_saved"]
        assert more == 2 * one * counts[pattern]
        assert (f.est_saving_s > without[pattern].est_saving_s) == bool(counts[pattern])


def test_a_branch_that_pools_first_is_priced_as_handed_over():
    torch.manual_seed(0)
    model = ConvNet()
    proj = model.blocks[1].downsample
    model.blocks[1].downsample = nn.Sequential(nn.AvgPool2d(1, 1), *proj)  # timm's ResNet-D
    x = torch.randn(4, 3, 8, 8)
    t = trace(_fused(model, x), x, train=True)
    assert _adds(t) == []
    assert sorted(r.module for r in t.ops if r.params.get("handed_over")) == ["blocks.0.bn3", "bn"]
