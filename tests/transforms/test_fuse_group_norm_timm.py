"""fuse-group-norm on timm's group norms: GroupNormAct and GroupNorm1Act (their activation
folded in, refused with a drop layer between), GroupNorm and GroupNorm1 followed by a ReLU, and
a small ResNet-GN (the checkpoint unchanged, the finding gone, revert exact). The helpers are
test_fuse_group_norm.py's."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from gpushape.kernels import GroupNormAct, _dispatch
from gpushape.transforms import revert

from .test_fuse_group_norm import _block, _checked_swap, _found, _optimize, _trained_like


# ---- timm -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "act, name", [(nn.ReLU, "relu"), (nn.SiLU, "silu"), (nn.GELU, "gelu"), (None, "none")]
)
def test_timm_group_norm_act(act, name):
    norm_act = pytest.importorskip("timm.layers.norm_act")
    kw = dict(act_layer=act) if act is not None else dict(apply_act=False)
    norm = norm_act.GroupNormAct(16, num_groups=4, **kw)
    assert type(norm.drop) is nn.Identity
    model, x = _block(norm=norm, act=nn.Identity()), torch.randn(2, 3, 6, 6)
    optimized, report = _checked_swap(model, x)
    assert [c.module for c in report.applied] == ["norm"]
    assert "GroupNormAct (GroupNorm" in report.applied[0].detail
    assert type(optimized.norm) is GroupNormAct and optimized.norm.activation == name
    assert optimized.norm.weight is norm.weight
    assert type(revert(optimized).norm) is norm_act.GroupNormAct


def test_timm_group_norm1_act_and_a_drop_between_is_refused():
    norm_act = pytest.importorskip("timm.layers.norm_act")
    x = torch.randn(2, 3, 5, 5)
    model = _block(norm=norm_act.GroupNorm1Act(16, act_layer=nn.SiLU), act=nn.Identity())
    optimized, report = _checked_swap(model, x)
    assert type(optimized.norm) is GroupNormAct and optimized.norm.num_groups == 1
    assert optimized.norm.activation == "silu"

    dropped = norm_act.GroupNormAct(16, num_groups=4, drop_layer=functools.partial(nn.Dropout, 0.1))
    model = _block(norm=dropped, act=nn.Identity())
    optimized, report = _optimize(model, x)
    assert not report.applied
    assert any("drop" in r.reason for r in report.refused)
    assert type(optimized.norm) is norm_act.GroupNormAct


@pytest.mark.parametrize("cls", ["GroupNorm", "GroupNorm1"])
def test_timm_group_norm_then_relu(cls):
    timm_norm = pytest.importorskip("timm.layers.norm")
    norm = getattr(timm_norm, cls)(16, **({"num_groups": 4} if cls == "GroupNorm" else {}))
    model, x = _block(norm=norm), torch.randn(2, 3, 6, 6)
    optimized, _ = _checked_swap(model, x)
    assert type(optimized.norm) is GroupNormAct and optimized.norm.activation == "relu"
    assert type(revert(optimized).norm) is type(norm)


def test_timm_resnet_gn(monkeypatch):
    """timm's ResNet with its GroupNorm (resnet50_gn's norm_layer) built small: each block's
    bn1 -> act1 and bn2 -> drop_block -> act2 fold the ReLU, bn3 (a residual add reads it) and
    the shortcut's norm swap plain; the checkpoint unchanged, the finding gone, revert exact.
    The kernels run their plain-PyTorch reference: in Triton's interpreter this model's
    training steps take minutes (tests/kernel_ops runs the kernels there)."""
    pytest.importorskip("timm")
    monkeypatch.setattr(_dispatch, "interpreting", lambda: False)
    from timm.layers import GroupNorm
    from timm.models.resnet import Bottleneck, ResNet

    torch.manual_seed(0)
    norm_layer = functools.partial(GroupNorm, num_groups=4)
    model = ResNet(Bottleneck, layers=[1, 1, 1, 1], channels=(8, 8, 16, 16), stem_width=8,
                   num_classes=5, norm_layer=norm_layer)  # fmt: skip
    _trained_like(model)
    layout = [(n, type(m)) for n, m in model.named_modules()]
    x = torch.randn(2, 3, 32, 32)
    optimized, report = _checked_swap(model, x)
    by_module = {c.module: c.detail for c in report.applied}
    blocks = [f"layer{i}.0" for i in range(1, 5)]
    fused = {"bn1", *(f"{b}.bn{j}" for b in blocks for j in (1, 2))}
    plain = {*(f"{b}.bn3" for b in blocks), *(f"{b}.downsample.1" for b in blocks)}
    assert set(by_module) == fused | plain
    assert all("ReLU fused" in by_module[m] for m in fused)
    assert all("-> gpushape GroupNormAct" in by_module[m] for m in plain)
    norms = [m for m in optimized.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 17 and all(type(m) is GroupNormAct for m in norms)
    assert _found(report.before) and not _found(report.after)
    restored = revert(optimized)
    assert restored is model and [(n, type(m)) for n, m in restored.named_modules()] == layout
