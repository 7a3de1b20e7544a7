"""Which LayerNorm subclasses fuse-norm-act treats as nn.LayerNorm: those whose forward is one
F.layer_norm of their input with their own shape, weight, bias and eps (timm's LayerNorm)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.transforms._norm_act_match import is_plain_layer_norm


class Same(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class OtherEps(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, 1e-3)


class Scaled(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps) * 2


class NoAffineUsed(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, None, None, self.eps)


class WithBuffer(Same):
    def __init__(self, n):
        super().__init__(n)
        self.register_buffer("scale", torch.ones(n))


class Branchy(nn.LayerNorm):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent: fx cannot trace it
            return x
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


@pytest.mark.parametrize(
    "module, plain",
    [
        (nn.LayerNorm(8), True),
        (Same(8), True),
        (Same(8, elementwise_affine=False), True),
        (OtherEps(8), False),
        (Scaled(8), False),
        (NoAffineUsed(8), False),
        (WithBuffer(8), False),
        (Branchy(8), False),
        (nn.GroupNorm(2, 8), False),
    ],
)
def test_plain_layer_norms(module, plain):
    assert is_plain_layer_norm(module) is plain


def test_a_hooked_subclass_is_not_plain():
    m = Same(8)
    m.register_forward_hook(lambda *a: None)
    assert not is_plain_layer_norm(m)


def test_timm_layer_norm_is_plain_unless_its_fast_norm_is_on():
    norm = pytest.importorskip("timm.layers.norm")
    m = norm.LayerNorm(8)
    assert is_plain_layer_norm(m)
    m._fast_norm = True
    assert not is_plain_layer_norm(m)
