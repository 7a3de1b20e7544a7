"""fuse-norm-act on user-style networks: same function, same state_dict, reversible,
idempotent, refused where unsafe; the audit no longer raises what it fixed."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from _chips import H100_DATASHEET
from gpushape.kernels import BatchNormAct2d, LayerNormGELU
from gpushape.transforms import (
    TransformContext,
    Verification,
    applied,
    get_transform,
    optimize,
    revert,
)
from gpushape.transforms._core import remember

from .nets import ConvNet, DataDependent, MLPBlock, TwoUsers

FUSE = ["fuse-norm-act"]


def _images(n: int = 4, c: int = 3, size: int = 8) -> torch.Tensor:
    return torch.randn(n, c, size, size)


def _fused_modules(model: nn.Module, kind: type) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, kind)]


def _apply(model: nn.Module, **options):
    """The transform alone (no audit, no numeric check): what it changes and refuses."""
    ctx = TransformContext(example_inputs=(_images(),), **options)
    outcome = get_transform("fuse-norm-act").apply(model, ctx)
    root = outcome.root or model
    remember(root, outcome.changes)
    return root, outcome


@pytest.fixture()
def convnet():
    torch.manual_seed(0)
    return ConvNet()


@pytest.fixture(scope="module")
def optimized():
    """ConvNet optimized once (the numeric check runs the fused kernels: slow in the
    interpreter): (original copy, parameters before, optimized model, report)."""
    torch.manual_seed(0)
    model = ConvNet()
    original = copy.deepcopy(model)
    params = dict(model.named_parameters())
    # the H100 datasheet: no measured host rates, so the tiny batch is not host-bound
    fused, report = optimize(model, (_images(),), gpu=H100_DATASHEET, dtype=torch.float32)
    return original, params, fused, report


def test_every_site_fused_and_verified(optimized):
    _, _, model, report = optimized
    fused = _fused_modules(model, BatchNormAct2d)
    assert sorted(fused) == sorted(
        [
            "bn",
            *(f"blocks.{i}.bn{j}" for i in range(2) for j in (1, 2, 3)),
            "blocks.1.downsample.1",  # the shortcut's BatchNorm, on the kernel
        ]
    )
    assert report.verified["fuse-norm-act"].passed and not report.rolled_back
    residual = [c.module for c in report.applied if "residual add +" in c.detail]
    assert sorted(residual) == ["blocks.0.bn3", "blocks.1.bn3"]
    branch = model.get_submodule("blocks.1.downsample.1")
    assert branch.activation == "none"


def test_the_shortcut_norm_runs_on_the_kernel_and_reverts(convnet):
    """The BatchNorm2d whose output is a fused site's residual (ResNet's downsample branch)
    moves onto the kernel with no activation: same outputs and running stats, its own undo."""
    original = copy.deepcopy(convnet)
    norm = convnet.blocks[1].downsample[1]
    model, outcome = _apply(convnet)
    swapped = [c for c in outcome.changes if c.module == "blocks.1.downsample.1"]
    assert len(swapped) == 1 and "no activation" in swapped[0].detail
    new = model.get_submodule("blocks.1.downsample.1")
    assert type(new) is BatchNormAct2d and new.weight is norm.weight
    assert new.running_mean is norm.running_mean
    x = _images()
    torch.testing.assert_close(model(x), original(x))
    torch.testing.assert_close(norm.running_var, original.blocks[1].downsample[1].running_var)
    assert revert(model) is convnet and convnet.blocks[1].downsample[1] is norm


@pytest.mark.parametrize("where", ["norm", "branch"])
def test_a_hooked_shortcut_norm_stays(convnet, where):
    target = convnet.blocks[1].downsample
    (target[1] if where == "norm" else target).register_forward_hook(lambda *a: None)
    model, outcome = _apply(convnet)
    assert type(model.get_submodule("blocks.1.downsample.1")) is nn.BatchNorm2d
    assert "blocks.1.bn3" in [c.module for c in outcome.changes]


def test_filter_fn_can_keep_the_shortcut_norm(convnet):
    model, _ = _apply(convnet, filter_fn=lambda m, fqn: "downsample" not in fqn)
    assert type(model.get_submodule("blocks.1.downsample.1")) is nn.BatchNorm2d
    assert type(model.get_submodule("blocks.1.bn3")) is BatchNormAct2d


def test_picked_from_the_findings_and_cleared_from_the_audit(optimized):
    _, _, _, report = optimized
    assert any(f.rule == "unfused-norm-act" for f in report.before.findings)
    assert report.predicted_saving_s["fuse-norm-act"] > 0
    assert not any(f.rule == "unfused-norm-act" for f in report.after.findings)
    assert report.step_after_s < report.step_before_s


def test_state_dict_round_trips(optimized):
    original, _, model, _ = optimized
    assert list(model.state_dict()) == list(original.state_dict())
    fresh = ConvNet()
    fresh.load_state_dict(model.state_dict(), strict=True)  # saves in the original layout
    copy.deepcopy(model).load_state_dict(original.state_dict(), strict=True)
    for key, value in original.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_parameters_are_the_same_objects(optimized):
    _, params, model, _ = optimized
    assert dict(model.named_parameters()) == params  # the optimizer's state stays valid


def test_a_training_run_tracks_the_original(optimized):
    """A few SGD steps: the fused model's losses follow the original's."""
    original, _, model, _ = optimized
    torch.manual_seed(1)
    data = [(_images(8), torch.randint(0, 10, (8,))) for _ in range(3)]
    losses = []
    for net in (copy.deepcopy(original), copy.deepcopy(model)):
        net.__dict__.pop("forward", None)  # optimize's autocast-bf16 (fp32-math): fp32 here
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        curve = []
        for _ in range(3):
            for x, y in data:
                loss = nn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                curve.append(loss.item())
        losses.append(curve)
    assert losses[0][-1] < losses[0][0]
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-4 * losses[0][0]


def test_revert_restores_the_original_exactly(convnet):
    blocks = list(convnet.blocks)
    model, outcome = _apply(convnet)
    # seven sites, one shortcut norm, the shortcut's input handed over
    assert len(outcome.changes) == 9 and applied(model)
    restored = revert(model)
    assert restored is convnet and list(restored.blocks) == blocks
    assert not _fused_modules(restored, BatchNormAct2d) and not applied(restored)


def test_twice_equals_once(convnet):
    model, first = _apply(convnet)
    again, second = _apply(model)
    assert first.changes and not second.changes and again is model


def test_layer_norm_gelu_fused_with_its_approximation():
    torch.manual_seed(0)
    block = MLPBlock()
    x = torch.randn(4, 8, 32)
    model, report = optimize(block, (x,), dtype=torch.float32, transforms=FUSE)
    (fused,) = [m for m in model.modules() if isinstance(m, LayerNormGELU)]
    assert fused.approximate == "tanh" and report.verified["fuse-norm-act"].passed


@pytest.mark.parametrize(
    ("net", "says"),
    [(TwoUsers, "other users"), (DataDependent, "torch.fx cannot trace")],
)
def test_unsafe_sites_are_refused_with_the_reason(net, says):
    model, outcome = _apply(net())
    assert not outcome.changes and not _fused_modules(model, BatchNormAct2d)
    assert any(says in r.reason for r in outcome.refusals), outcome.refusals


def test_a_hook_refuses_the_site(convnet):
    convnet.blocks[0].register_forward_hook(lambda m, i, o: None)
    _, outcome = _apply(convnet)
    assert any("hook" in r.reason for r in outcome.refusals)
    assert outcome.changes and not any(c.module.startswith("blocks.0.") for c in outcome.changes)


def test_filter_fn_scopes_the_rewrite(convnet):
    _, outcome = _apply(convnet, filter_fn=lambda module, fqn: not fqn.startswith("blocks.1"))
    assert outcome.changes
    assert not any(c.module.startswith("blocks.1") for c in outcome.changes)


def test_a_failing_check_rolls_back(convnet, monkeypatch):
    """A rewrite that changes the function is undone and reported."""
    from gpushape.transforms import _optimize

    monkeypatch.setattr(
        _optimize, "verify", lambda *a: Verification(passed=False, checked=1, worst="forced")
    )
    model, report = optimize(convnet, (_images(),), dtype=torch.float32, transforms=FUSE)
    assert model is convnet and not report.applied and not applied(model)
    assert report.rolled_back[0].reason == "forced"
    assert not _fused_modules(model, BatchNormAct2d)


class _ShortcutChild(nn.Module):
    """A block whose shortcut BatchNorm2d is its own child, not inside a Sequential."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.proj = nn.Conv2d(c, c, 1, bias=False)
        self.bn_proj = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.bn_proj(self.proj(x)))


def test_a_shortcut_norm_held_by_the_block_itself():
    """bn(a) + bn_proj(b) -> ReLU: the first norm takes the add and the activation (once: the
    add is not claimed twice), the second runs on the kernel with no activation."""
    torch.manual_seed(0)
    block = _ShortcutChild()
    original = copy.deepcopy(block)
    x = torch.randn(2, 8, 6, 6)
    ctx = TransformContext(example_inputs=(x,))
    outcome = get_transform("fuse-norm-act").apply(block, ctx)
    model = outcome.root
    remember(model, outcome.changes)
    # proj reads the block's input through hand_over (test_fuse_norm_act_handover.py)
    assert [c.module for c in outcome.changes] == ["bn", "proj", "bn_proj"]
    assert type(model.bn_proj) is BatchNormAct2d and model.bn_proj.activation == "none"
    torch.testing.assert_close(model(x), original(x))
    restored = revert(model)
    assert restored is block and type(block.bn_proj) is nn.BatchNorm2d


class _ShortcutTwice(_ShortcutChild):
    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.bn_proj(self.proj(x))) + self.bn_proj(x)


def test_a_shortcut_norm_called_twice_stays():
    block = _ShortcutTwice()
    ctx = TransformContext(example_inputs=(torch.randn(2, 8, 6, 6),))
    outcome = get_transform("fuse-norm-act").apply(block, ctx)
    assert "bn_proj" not in [c.module for c in outcome.changes]


class _DropBetween(nn.Module):
    """timm's order: norm, an nn.Identity standing in for drop_block, activation."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.drop = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.drop(self.bn(self.conv(x)))) * 2


def test_an_identity_between_norm_and_activation_is_stepped_over():
    torch.manual_seed(0)
    block = _DropBetween()
    original = copy.deepcopy(block)
    x = torch.randn(2, 8, 6, 6)
    outcome = get_transform("fuse-norm-act").apply(block, TransformContext(example_inputs=(x,)))
    model = outcome.root
    assert [c.module for c in outcome.changes] == ["bn"]
    assert type(model.bn) is BatchNormAct2d and model.bn.activation == "relu"
    assert type(model.drop) is nn.Identity  # kept, after the fused call
    torch.testing.assert_close(model(x), original(x))


def test_a_hooked_identity_between_keeps_the_site():
    block = _DropBetween()
    block.drop.register_forward_hook(lambda *a: None)
    ctx = TransformContext(example_inputs=(torch.randn(2, 8, 6, 6),))
    assert not get_transform("fuse-norm-act").apply(block, ctx).changes
