"""Matmul and convolution formulas against work counted by hand.

The hand count runs the op on real CPU tensors of ones: every multiply-add adds exactly 1 to
some output, so the sum of the output is the number of MACs. Padding is made explicit (the
input padded with ones, the conv run unpadded), since the dense convention counts padding taps.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, ops_named, trace_fn, work
from torch import nn

import gpushape
from gpushape.tracing.flops.conv import is_direct

# (N, Cin, Cout, H, W, kernel, stride, padding, dilation, groups)
CONV_CASES = [
    (2, 8, 16, 9, 11, 3, 1, 1, 1, 1),
    (2, 32, 64, 9, 11, 3, 2, 0, 1, 4),  # groups of 8 channels: implicit GEMMs
    (2, 8, 16, 9, 11, 3, 2, 0, 1, 4),  # groups, stride
    (1, 6, 6, 10, 10, 3, 1, 2, 2, 6),  # depthwise, dilation, padding
    (3, 4, 8, 7, 5, (1, 3), (2, 1), (0, 1), 1, 2),  # rectangular everything
]


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def hand_conv_macs(n, cin, cout, h, w, k, stride, padding, dilation, groups) -> int:
    ph, pw = _pair(padding)
    x = F.pad(torch.ones(n, cin, h, w), (pw, pw, ph, ph), value=1.0)
    weight = torch.ones(cout, cin // groups, *_pair(k))
    return int(F.conv2d(x, weight, stride=stride, dilation=dilation, groups=groups).sum())


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_forward_flops_are_twice_the_hand_counted_macs(case, bias):
    n, cin, cout, h, w, k, stride, padding, dilation, groups = case
    with torch.device("meta"):
        conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups, bias=bias)
    t = gpushape.trace(conv, (meta(n, cin, h, w),))
    rec = only(t, "convolution")
    macs = hand_conv_macs(*case)
    out_numel = rec.outputs[0].numel
    # narrow groups run as direct kernels: the same FLOPs, none of them as a GEMM
    assert work(rec).gemm_flops == (0 if is_direct(cin, groups) else 2 * macs)
    assert work(rec).flops == 2 * macs + (out_numel if bias else 0)  # one add per output
    assert rec.params["groups"] == groups and rec.params["stride"] == _pair(stride)


@pytest.mark.parametrize("case", [c for c in CONV_CASES if c[7] == 0])  # unpadded: exact
def test_conv_backward_dgrad_and_wgrad_each_equal_the_forward_macs(case):
    n, cin, cout, h, w, k, stride, padding, dilation, groups = case
    x = torch.ones(n, cin, h, w, requires_grad=True)
    weight = torch.ones(cout, cin // groups, *_pair(k), requires_grad=True)
    y = F.conv2d(x, weight, stride=stride, dilation=dilation, groups=groups)
    y.backward(torch.ones_like(y))
    dgrad_macs, wgrad_macs = int(x.grad.sum()), int(weight.grad.sum())  # one per product

    with torch.device("meta"):
        conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups, bias=False)
    t = gpushape.trace(conv, (meta(n, cin, h, w, requires_grad=True),), train=True)
    bwd = only(t, "convolution_backward")
    assert work(bwd).flops == 2 * (dgrad_macs + wgrad_macs)
    if is_direct(cin, groups):
        assert work(bwd).gemms == ()
    else:
        dgrad, wgrad = work(bwd).gemms
        assert (dgrad.flops, wgrad.flops) == (2 * dgrad_macs, 2 * wgrad_macs)
        assert work(bwd).gemm_flops == 2 * work(only(t, "convolution")).gemm_flops
    assert bwd.module == "" and bwd.fwd_index == only(t, "convolution").index


def test_conv_backward_without_input_grad_does_wgrad_only():
    with torch.device("meta"):
        conv = nn.Conv2d(3, 8, 3, bias=True)
    t = gpushape.trace(conv, (meta(2, 3, 8, 8),), train=True)
    fwd, bwd = only(t, "convolution"), only(t, "convolution_backward")
    assert bwd.params["output_mask"] == (False, True, True)
    assert work(bwd).gemm_flops == work(fwd).gemm_flops  # wgrad alone
    grad_out_numel = bwd.input("grad_output").numel
    assert work(bwd).flops == work(fwd).gemm_flops + grad_out_numel  # + the bias reduction
    assert work(bwd).kernels == 2


@pytest.mark.parametrize("stride,groups", [(1, 1), (2, 1), (2, 3)])
def test_transposed_conv_forward_macs(stride, groups):
    n, cin, cout, h, k = 2, 6, 9, 5, 3
    x, weight = torch.ones(n, cin, h, h), torch.ones(cin, cout // groups, k, k)
    macs = int(F.conv_transpose2d(x, weight, stride=stride, groups=groups).sum())
    with torch.device("meta"):
        deconv = nn.ConvTranspose2d(cin, cout, k, stride, groups=groups, bias=False)
    t = gpushape.trace(deconv, (meta(n, cin, h, h),))
    assert work(only(t, "convolution")).flops == 2 * macs


@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (64, 32, 16)])
def test_mm_addmm_bmm_baddbmm(m, k, n):
    hand = int((torch.ones(m, k) @ torch.ones(k, n)).sum())  # M N K multiply-adds
    b = 3
    t = trace_fn(
        lambda a, w, bias, batch1, batch2, acc: (
            a @ w,
            torch.addmm(bias, a, w),
            torch.bmm(batch1, batch2),
            torch.baddbmm(acc, batch1, batch2),
        ),
        (meta(m, k), meta(k, n), meta(n), meta(b, m, k), meta(b, k, n), meta(b, m, n)),
    )
    assert work(only(t, "mm")).flops == 2 * hand
    assert work(only(t, "addmm")).flops == 2 * hand + m * n  # + one add per output
    assert work(only(t, "bmm")).flops == 2 * b * hand
    assert work(only(t, "baddbmm")).flops == 2 * b * hand + b * m * n
    gemm = work(only(t, "bmm")).gemms[0]
    assert (gemm.m, gemm.n, gemm.k, gemm.batch) == (m, n, k, b)


def test_linear_on_3d_input_is_one_gemm_over_all_tokens():
    with torch.device("meta"):
        lin = nn.Linear(32, 48)
    t = gpushape.trace(lin, (meta(4, 10, 32),))
    gemm = work(only(t, "addmm")).gemms[0]
    assert (gemm.m, gemm.n, gemm.k) == (40, 48, 32)
    assert only(t, "addmm").module == "" and only(t, "addmm").module_type == "Linear"


def test_linear_backward_is_two_gemms_of_the_forward_size():
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8))
    t = gpushape.trace(net, (meta(5, 16),), train=True)
    second = next(op for op in ops_named(t, "addmm") if op.module == "2")
    bwd = [op for op in t.backward_of(second.index) if op.name == "mm"]
    assert len(bwd) == 2 and all(op.module == "2" for op in bwd)  # dgrad and wgrad
    assert sum(work(op).flops for op in bwd) == 2 * work(second).gemm_flops


def test_leading_dimensions_name_the_misaligned_dim():
    # x (M, K) row-major @ w.t() where w is (N, K): every operand's leading dim is K or N.
    t = trace_fn(lambda x, w: x @ w.t(), (meta(64, 4095), meta(128, 4095)))
    align = dict(work(only(t, "mm")).gemms[0].align_dims)
    assert align == {"K": 4095, "N": 128}
    t = trace_fn(lambda x, w: x.t() @ w, (meta(4095, 64), meta(4095, 128)))  # A column-major
    assert dict(work(only(t, "mm")).gemms[0].align_dims) == {"M": 64, "N": 128}
