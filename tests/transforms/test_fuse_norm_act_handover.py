"""fuse-norm-act's gradient hand-over between blocks: a block's output feeds the next block's
first convolution and its residual add (the fused site hands that gradient over by itself) or
its downsampling branch (reached through `hand_over`); the producing norm's backward then reads
both parts in its kernels instead of autograd's add. Same gradients as the original model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn

from gpushape.kernels.batch_norm.batch_norm_act import hand_over
from gpushape.transforms import TransformContext, get_transform

from .nets import Bottleneck, ConvNet


def _fuse(model: nn.Module, x: torch.Tensor):
    outcome = get_transform("fuse-norm-act").apply(model, TransformContext(example_inputs=(x,)))
    return outcome.root or model, outcome


def _hand_over_users(model: nn.Module) -> list[str]:
    found = []
    for name, m in model.named_modules():
        if isinstance(m, fx.GraphModule):
            for node in m.graph.nodes:
                if node.target is hand_over:
                    found += [f"{name}.{u.target}" for u in node.users]
    return found


def _same_gradients(original: nn.Module, fused: nn.Module, x: torch.Tensor, tol: float) -> None:
    """One cross-entropy step's parameter gradients of both models agree (rtol `tol`)."""
    target = torch.randint(0, 10, (x.shape[0],))
    grads = []
    for net in (original, fused):
        nn.functional.cross_entropy(net(x), target).backward()
        grads.append(dict(net.named_parameters()))
    assert grads[0].keys() == grads[1].keys()
    for name, p in grads[0].items():
        torch.testing.assert_close(grads[1][name].grad, p.grad, rtol=tol, atol=tol / 10)


def test_the_downsampling_branch_reads_through_hand_over():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    model, outcome = _fuse(ConvNet(), x)
    assert _hand_over_users(model) == ["blocks.1.downsample"]
    said = [c for c in outcome.changes if "handed to the fused norm" in c.detail]
    assert [c.module for c in said] == ["blocks.1.downsample"]


def test_a_block_without_a_branch_gets_no_hand_over():
    model, _ = _fuse(nn.Sequential(Bottleneck(8), Bottleneck(8)), torch.randn(2, 8, 6, 6))
    assert _hand_over_users(model) == []  # the residual site hands over by itself


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["nchw", "cl"])
def test_gradients_equal_the_original_models(interpret, parts, fmt):
    torch.manual_seed(0)
    original = ConvNet().to(memory_format=fmt)
    x = torch.randn(4, 3, 8, 8).to(memory_format=fmt)
    fused, _ = _fuse(copy.deepcopy(original), x)
    _same_gradients(original, fused, x, 1e-4)
    # the stem's norm (its output the first block's residual) and the first block's last
    # norm (its output the second block's downsampling input) each read two parts
    assert parts.count(True) == 2


def test_torchvision_resnet_hands_over_between_every_pair_of_blocks(interpret, parts):
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    original = models.resnet18(num_classes=10)
    x = torch.randn(4, 3, 40, 40)  # 16 values a channel at layer4: well-conditioned statistics
    fused, _ = _fuse(copy.deepcopy(original), x)
    assert _hand_over_users(fused) == [f"layer{i}.0.downsample" for i in (2, 3, 4)]
    _same_gradients(original, fused, x, 2e-4)
    # 8 BasicBlocks; the first adds the max pool's output (no fused norm made it): 4 residual
    # hand-overs (the other blocks without a branch) and 3 through hand_over (the branches)
    assert parts.count(True) == 7


def test_hand_over_is_the_tensor_itself_where_no_fused_norm_made_it():
    x = torch.randn(3, 4, requires_grad=True)
    assert hand_over(x) is x
    y = x * 2
    assert hand_over(y) is y


def test_a_branch_that_pools_first_hands_over_too(interpret, parts):
    """timm's ResNet-D shortcut: AvgPool2d, then the 1x1 convolution and its norm."""
    torch.manual_seed(0)
    original = ConvNet()
    proj = original.blocks[1].downsample
    original.blocks[1].downsample = nn.Sequential(nn.AvgPool2d(1, 1), *proj)
    x = torch.randn(4, 3, 8, 8)
    fused, _ = _fuse(copy.deepcopy(original), x)
    assert _hand_over_users(fused) == ["blocks.1.downsample"]
    _same_gradients(original, fused, x, 1e-4)
    assert parts.count(True) == 2
