"""gpushape against torch.utils.flop_counter.FlopCounterMode: agreement where both are right,
and, where they differ, the work counted by hand to show which one is.

1. Convolution weight gradient with groups. FlopCounterMode computes grad_weight's FLOPs as a
   convolution of the input (channels as batch) with grad_output (channels as filters), i.e.
   Cout x Cin x taps x N x positions, ignoring that each group only sees Cin/groups input
   channels. It overcounts by the number of groups (x32 for ResNeXt's 32 groups, x C for a
   depthwise conv). By hand: every element of grad_weight (Cout, Cin/groups, kh, kw) is a sum
   of N x Hout x Wout products, so running the backward on tensors of ones makes each element
   of grad_weight equal to its own number of multiply-adds.
2. Causal attention. FlopCounterMode counts the full Tq x Tk score matrix whether or not
   `is_causal` is set. The fused kernels skip masked tiles; the work is the unmasked pairs,
   which we count from PyTorch's own causal mask. (For the *work done*, the truth is in between
   by the diagonal tiles; for useful FLOPs, the unmasked count is exact.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, trace_fn, work
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import gpushape


def _flop_counter(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_agree_on_matmuls_and_ungrouped_convolutions():
    with torch.device("meta"):
        net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.Flatten(),
            nn.Linear(32 * 64, 10),
        )
    x = meta(2, 3, 16, 16)
    t = gpushape.trace(net, (x,), train=True)
    ours = sum(work(op).gemm_flops for op in t.ops)
    reference = _flop_counter(lambda: net(x).sum().backward())
    assert ours == reference


@pytest.mark.parametrize("groups", [4, 16])
def test_grouped_conv_weight_gradient(groups):
    n, c, hw, k = 2, 16, 8, 3
    # By hand: ones in, ones out-grad -> each grad_weight element is its number of products.
    x = torch.ones(n, c, hw, hw)
    weight = torch.ones(c, c // groups, k, k, requires_grad=True)
    y = F.conv2d(x, weight, groups=groups)
    y.backward(torch.ones_like(y))
    wgrad_macs = int(weight.grad.sum())
    assert wgrad_macs == c * (c // groups) * k * k * n * (hw - k + 1) ** 2

    with torch.device("meta"):
        conv = nn.Conv2d(c, c, k, groups=groups, bias=False)
    xm = meta(n, c, hw, hw)  # no input gradient: the backward is the weight gradient alone
    t = gpushape.trace(conv, (xm,), train=True)
    ours = work(only(t, "convolution_backward")).flops
    theirs = _flop_counter(lambda: conv(xm).sum().backward()) - 2 * wgrad_macs  # minus forward
    assert ours == 2 * wgrad_macs  # right
    assert theirs == groups * 2 * wgrad_macs  # FlopCounterMode: `groups` times too many


@pytest.mark.parametrize("t_len", [64, 100])
def test_causal_attention(t_len):
    b, h, d = 2, 4, 32
    unmasked = int(torch.ones(t_len, t_len, dtype=torch.bool).tril().sum())  # PyTorch's mask
    hand = 2 * b * h * unmasked * (d + d)  # Q K^T and P V over the unmasked pairs

    q = meta(b, h, t_len, d, dtype=torch.bfloat16)
    t = trace_fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, q, q))
    ours = work(only(t, "_scaled_dot_product_flash_attention")).flops
    theirs = _flop_counter(
        lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)
    )
    assert ours == hand
    assert theirs == 2 * b * h * t_len * t_len * (d + d)  # the full square
    assert theirs / ours == pytest.approx(2 * t_len / (t_len + 1))
