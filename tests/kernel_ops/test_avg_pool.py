"""LayoutSafeAvgPool2d on the CPU: nn.AvgPool2d's outputs and gradients in both layouts, its
NCHW-backward path forced (the bug it guards against, pytorch#188344, is CUDA's), and the
check that measures the bug, against a pool that has it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.kernels import LayoutSafeAvgPool2d
from gpushape.kernels.pooling import avg_pool
from gpushape.kernels.pooling.avg_pool import avg_pool_nhwc_backward_ok

CL = torch.channels_last
SETTINGS = [  # kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    (3, 1, 1, False, False, None),  # PoolFormer's token mixer
    (3, 2, 1, True, True, None),
    (3, 2, 1, True, False, None),
    (2, 2, 0, False, True, None),
    ((3, 5), (2, 1), (1, 2), True, False, None),
    (3, 1, 1, False, True, 4),
    (5, 3, 2, False, False, 7),
]
SHAPES = [(2, 5, 9, 8), (1, 1, 6, 6), (3, 4, 1, 1)]


def _grads(pool: nn.Module, x: torch.Tensor, dy_seed: int = 1):
    x = x.detach().requires_grad_()
    y = pool(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(dy_seed), dtype=y.dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx, y.grad_fn


def _input(shape, layout, dtype=torch.float64):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    return x.contiguous(memory_format=layout)


@pytest.fixture
def broken(monkeypatch):
    """The bug forced on the CPU: the check reports it, and the CPU counts as affected."""
    monkeypatch.setattr(avg_pool, "AFFECTED_DEVICES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(avg_pool, "avg_pool_nhwc_backward_ok", lambda device: False)


@pytest.mark.parametrize("layout", [torch.contiguous_format, CL], ids=["nchw", "cl"])
@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_equals_nn_avg_pool2d(settings, layout):
    for shape in SHAPES:
        if settings[2] == 0 and shape[2] < settings[0]:
            continue  # no window fits a 1 x 1 map without padding
        x = _input(shape, layout)
        y, dx, grad_fn = _grads(LayoutSafeAvgPool2d(*settings), x)
        want_y, want_dx, _ = _grads(nn.AvgPool2d(*settings), x)
        torch.testing.assert_close(y, want_y, rtol=0, atol=0)
        torch.testing.assert_close(dx, want_dx, rtol=0, atol=0)
        assert type(grad_fn).__name__ == "AvgPool2DBackward0"  # PyTorch's own, on the CPU
        assert dx.stride() == want_dx.stride()


@pytest.mark.parametrize("settings", [s for s in SETTINGS if s[2] != 0], ids=str)
def test_forced_path_gives_the_nchw_gradient_in_channels_last(broken, settings):
    x = _input((2, 6, 11, 10), CL)
    y, dx, grad_fn = _grads(LayoutSafeAvgPool2d(*settings), x)
    assert type(grad_fn).__name__ == "_NchwBackwardAvgPool2dBackward"
    want_y, want_dx, _ = _grads(nn.AvgPool2d(*settings), x.contiguous())
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(dx, want_dx, rtol=1e-12, atol=1e-12)
    assert dx.is_contiguous(memory_format=CL) and not dx.is_contiguous()
    assert y.is_contiguous(memory_format=CL)


def test_forced_path_float32_and_a_non_dense_input(broken):
    big = _input((2, 12, 9, 9), CL, torch.float32)
    x = big[:, 2:9]  # a channel slice of an NHWC tensor: PyTorch pools it in NHWC too
    assert not x.is_contiguous() and not x.is_contiguous(memory_format=CL)
    pool = LayoutSafeAvgPool2d(3, 1, 1, count_include_pad=False)
    _, dx, grad_fn = _grads(pool, x)
    assert type(grad_fn).__name__ == "_NchwBackwardAvgPool2dBackward"
    _, want_dx, _ = _grads(nn.AvgPool2d(3, 1, 1, count_include_pad=False), x.contiguous())
    torch.testing.assert_close(dx, want_dx, rtol=1e-6, atol=1e-6)


def test_forced_path_has_a_second_derivative(broken):
    x = _input((1, 3, 6, 5), CL).requires_grad_()
    pool = LayoutSafeAvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
    assert torch.autograd.gradcheck(pool, (x,))
    assert torch.autograd.gradgradcheck(pool, (x,))


@pytest.mark.parametrize("case", ["padding 0", "NCHW", "3-D input", "no grad", "torch.func"])
def test_plain_path_where_the_bug_cannot_hit(broken, case):
    padding = 0 if case == "padding 0" else 1
    pool = LayoutSafeAvgPool2d(3, 1, padding)
    x = _input((2, 4, 7, 7), torch.contiguous_format if case == "NCHW" else CL)
    x = (x[0] if case == "3-D input" else x).requires_grad_()
    if case == "no grad":
        with torch.no_grad():
            assert not avg_pool.needs_nchw_backward(x, padding)
            assert pool(x).grad_fn is None
    elif case == "torch.func":
        dx = torch.func.grad(lambda t: pool(t).square().sum())(x.detach())
        want = torch.func.grad(lambda t: F.avg_pool2d(t, 3, 1, 1).square().sum())(x.detach())
        torch.testing.assert_close(dx, want, rtol=0, atol=0)
    else:
        assert not avg_pool.needs_nchw_backward(x, padding)
        assert type(pool(x).grad_fn).__name__ == "AvgPool2DBackward0"


def test_a_module_like_nn_avg_pool2d():
    torch_pool = nn.AvgPool2d((3, 2), stride=None, padding=1, ceil_mode=True,
                              count_include_pad=False, divisor_override=5).eval()  # fmt: skip
    pool = LayoutSafeAvgPool2d.from_module(torch_pool)
    assert isinstance(pool, nn.AvgPool2d) and not pool.training
    for attr in ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                 "divisor_override"):  # fmt: skip
        assert getattr(pool, attr) == getattr(torch_pool, attr), attr
    assert repr(pool) == repr(torch_pool).replace("AvgPool2d", "LayoutSafeAvgPool2d", 1)
    assert pool.state_dict() == torch_pool.state_dict() == {}
    with pytest.raises(TypeError, match=r"expected nn\.AvgPool2d, got MaxPool2d"):
        LayoutSafeAvgPool2d.from_module(nn.MaxPool2d(3))


# ---- the check --------------------------------------------------------------------------
class _DropsPadding(torch.autograd.Function):
    """avg_pool2d whose channels_last backward takes the windows one pixel off, as
    pytorch#188344's NHWC kernel does without the padding offset."""

    @staticmethod
    def forward(ctx, x, args):
        ctx.args, ctx.cl = args, x.is_contiguous(memory_format=CL) and not x.is_contiguous()
        ctx.shape = x.shape
        return F.avg_pool2d(x, *args)

    @staticmethod
    def backward(ctx, dy):
        nchw = torch.empty(ctx.shape, dtype=dy.dtype)
        k, s, p, ceil, count = ctx.args
        dx = torch.ops.aten.avg_pool2d_backward(dy.contiguous(), nchw, [k, k], [s, s], [p, p],
                                                ceil, count, None)  # fmt: skip
        if ctx.cl:
            dx = torch.roll(dx, shifts=(p, p), dims=(2, 3)).contiguous(memory_format=CL)
        return dx, None


def _buggy_pool(x, kernel, stride, padding, count_include_pad=True):
    return _DropsPadding.apply(x, (kernel, stride, padding, False, count_include_pad))


def test_the_check_tells_a_buggy_backward_from_a_right_one():
    assert avg_pool.nhwc_matches_nchw("cpu")
    assert not avg_pool.nhwc_matches_nchw("cpu", pool=_buggy_pool)


def test_the_check_is_true_off_cuda_and_measured_once(monkeypatch):
    assert avg_pool_nhwc_backward_ok("cpu") is True
    assert avg_pool_nhwc_backward_ok("meta") is True
    if not torch.cuda.is_available():
        assert avg_pool_nhwc_backward_ok("cuda") is True
        assert avg_pool_nhwc_backward_ok() is True
    calls = []
    monkeypatch.setattr(avg_pool, "AFFECTED_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(avg_pool, "_CHECKED", {})
    monkeypatch.setattr(avg_pool, "nhwc_matches_nchw", lambda d: calls.append(d) or False)
    assert avg_pool_nhwc_backward_ok("cpu") is False
    assert avg_pool_nhwc_backward_ok(torch.device("cpu")) is False
    assert calls == [torch.device("cpu")]
