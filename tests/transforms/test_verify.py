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


# ---- a run of the original that is itself wrong (pytorch#188344) -------------------------
class _GradTimes(torch.autograd.Function):
    """The identity forward; its gradient 1.5x: a rewrite whose backward is wrong."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy * 1.5


class _WrongBackward(nn.Module):
    def forward(self, x):
        return _GradTimes.apply(x)


def test_a_wildly_wrong_run_of_the_original_is_left_out(convnet_ref):
    """The original's channels_last run off by 3 (300 %, as pytorch#188344 put PoolFormerV2's
    stage-3 norm gradients 190-310 % off on an H100) in every gradient: the right model still
    passes, a model whose early gradients are 50 % off or more fails, as it would with no such run;
    with the wrong run kept the bound would be 2 x 3 and both would pass."""
    model, inputs, (ref64, sames, dtype) = convnet_ref
    assert len(sames) == 2  # NCHW and channels_last: the model has 4-D weights
    off = {k: v * 4 if k.startswith("grad ") else v for k, v in sames[1].items()}
    ref = (ref64, [sames[0], off], dtype)
    right = verify(copy.deepcopy(model), inputs, ref)
    assert right.passed
    grads = {k for k in ref64 if k.startswith("grad ")}
    assert right.left_out.keys() == grads  # outputs kept: the run's forward is right
    assert all(abs(errs[0] - 3.0) < 1e-3 for errs in right.left_out.values())
    wrong = copy.deepcopy(model)
    wrong.blocks[0].relu = nn.Sequential(nn.ReLU(), _WrongBackward())  # 1.5x per call
    check = verify(wrong, inputs, ref)
    assert not check.passed and "left out as wrong" in check.worst
    assert not verify(wrong, inputs, (ref64, [sames[0]], dtype)).passed
    assert verify(wrong, inputs, (ref64, [off], dtype)).passed  # one run: nothing to tell


@pytest.mark.parametrize(
    ("errs", "own", "left_out"),
    [
        ([2e-7, 3.1], 2e-7, [3.1]),  # pytorch#188344's channels_last run
        ([2e-7, 6e-7], 6e-7, []),  # two formats rounding differently
        ([2e-7, 0.4], 0.4, []),  # far, but not beyond what a rewrite's error may be
        ([0.06, 0.9], 0.9, []),  # not 10x apart
        ([3e2, 5e3], 5e3, []),  # a gradient that is about zero: no run at rounding
        ([1e-5, 2.0, 1e-5], 1e-5, [2.0]),
    ],
)
def test_which_runs_are_left_out(errs, own, left_out):
    from gpushape.transforms._verify import own_error

    assert own_error(errs, 1e-4) == (own, left_out)


# ---- a tensor too ill-conditioned to judge at bf16 is judged at float32 -------------------
class _HalfGradTimes(torch.autograd.Function):
    """The identity forward; its gradient 1.5x at bf16 and exact at float32: a rewrite that
    rounds worse at bf16 alone (stands in for a reduction reordered on a gradient that
    nearly cancels)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy * 1.5 if dy.dtype == torch.bfloat16 else dy


@pytest.fixture(scope="module")
def bf16_ref():
    from gpushape.transforms._verify import lower_reference

    torch.manual_seed(0)
    model = ConvNet().to(torch.bfloat16)
    x = torch.randn(4, 3, 8, 8, dtype=torch.bfloat16)
    return model, (x,), reference(model, (x,)), lower_reference(model, (x,), torch.float32)


def _with(model, fn):
    """`model` with `fn` applied to its head's output (a hook: the parameters keep their names)."""
    out = copy.deepcopy(model)
    out.head.register_forward_hook(lambda module, args, y: fn.apply(y))
    return out


def test_an_ill_conditioned_tensor_is_judged_at_float32(bf16_ref):
    """Every gradient 50 % off at bf16 fails while the original's float32 run says they are
    well-conditioned; the same rewrite passes once that run puts them 1e-3 from float64 (bf16's
    rounding alone would then move them by about 65), judged at float32, where it is exact; a
    rewrite 50 % off at float32 too still fails there."""
    from gpushape.transforms._verify import ill_conditioned

    model, inputs, ref, at32 = bf16_ref
    ref64 = ref[0]
    half_wrong = _with(model, _HalfGradTimes)
    plain = verify(half_wrong, inputs, ref, original_at=lambda d: at32)
    assert not plain.passed and not plain.widened  # well-conditioned: judged at bf16
    noisy = {k: v + 1e-3 * v.abs().max() if k.startswith("grad ") else v for k, v in at32.items()}
    assert ill_conditioned(1e-3, torch.bfloat16) and not ill_conditioned(1e-6, torch.bfloat16)
    assert not ill_conditioned(1.0, torch.float32)
    widened = verify(half_wrong, inputs, ref, original_at=lambda d: noisy)
    assert widened.passed and widened.widened
    assert set(widened.widened) <= {k for k in ref64 if k.startswith("grad ")}
    assert not verify(half_wrong, inputs, ref).passed  # no float32 run to judge by
    wrong = _with(model, _GradTimes)
    check = verify(wrong, inputs, ref, original_at=lambda d: noisy)
    assert not check.passed and "in float32" in check.worst


def test_optimizes_check_offers_the_originals_float32_run(monkeypatch):
    """optimize's gate hands verify the original's runs at other dtypes (made once, kept)."""
    from gpushape.transforms import _optimize

    seen = {}

    def spy(model, inputs, ref, lower=None, original_at=None):
        seen["at"] = original_at
        return verify(model, inputs, ref, lower, original_at)

    monkeypatch.setattr(_optimize, "verify", spy)
    torch.manual_seed(0)
    block = MLPBlock()
    x = torch.randn(2, 4, 32)
    ref = _optimize._Reference(block, (x,))
    assert _optimize._check(copy.deepcopy(block), (x,), ref).passed
    run = seen["at"](torch.float64)
    assert set(run) == set(ref.results()[0]) and seen["at"](torch.float64) is run
