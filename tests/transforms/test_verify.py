"""The whole-model gate: the same function passes, a subtly wrong one fails."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpushape.transforms import verify
from gpushape.transforms._verify import reference

from .nets import ConvNet, MLPBlock


@pytest.fixture(scope="module")
def convnet_ref():
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(4, 3, 8, 8)
    return model, (x,), reference(model, (x,))


def test_the_same_model_in_channels_last_passes(convnet_ref):
    model, inputs, ref = convnet_ref
    check = verify(copy.deepcopy(model).to(memory_format=torch.channels_last), inputs, ref)
    assert check.passed and check.checked > 10


@pytest.mark.parametrize(
    "break_it",
    [
        lambda m: m.blocks[0].bn2.weight.data.mul_(1.001),  # 0.1% off one scale
        lambda m: setattr(m.blocks[0], "relu", nn.Identity()),  # activations lost
        lambda m: m.head.bias.data.add_(1e-3),  # an output shifted
    ],
)
def test_a_subtly_wrong_model_fails(convnet_ref, break_it):
    model, inputs, ref = convnet_ref
    wrong = copy.deepcopy(model)
    break_it(wrong)
    assert not verify(wrong, inputs, ref).passed


def test_a_missing_gradient_fails():
    torch.manual_seed(0)
    block = MLPBlock()
    x = torch.randn(2, 4, 32)
    ref = reference(block, (x,))
    frozen = copy.deepcopy(block)
    frozen.fc.weight.requires_grad_(False)
    assert not verify(frozen, (x,), ref).passed


def test_a_rewrite_that_breaks_the_forward_is_rolled_back(monkeypatch):
    """A transform whose result no longer runs is undone and reported, not raised."""
    from gpushape.transforms import _optimize, optimize
    from gpushape.transforms._core import Change, Outcome, TransformInfo

    def broken(model, ctx):
        old = model.fc
        model.fc = nn.Linear(3, 3)  # the wrong width: the forward raises
        return Outcome(
            changes=[
                Change(
                    transform="channels-last",
                    module="fc",
                    detail="x",
                    undo=lambda: setattr(model, "fc", old),
                )
            ]
        )

    monkeypatch.setattr(_optimize, "get_transform", lambda tid: TransformInfo(tid, broken, True))
    torch.manual_seed(0)
    block = MLPBlock()
    x = torch.randn(2, 4, 32)
    model, report = optimize(block, (x,), dtype=torch.float32, transforms=["channels-last"])
    assert model.fc.in_features == 32 and not report.applied
    assert "failed to run" in report.rolled_back[0].reason
