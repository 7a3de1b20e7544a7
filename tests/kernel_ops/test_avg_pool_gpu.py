"""LayoutSafeAvgPool2d on a CUDA GPU (`pytest -m gpu` on the GPU machine): at PoolFormerV2-S12's
stage-4 shape its channels_last input gradient equals PyTorch's NCHW one, whether or not the
installed PyTorch has pytorch#188344, and the check agrees with PyTorch's own NHWC gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels import LayoutSafeAvgPool2d
from gpushape.kernels.pooling import avg_pool
from gpushape.kernels.pooling.avg_pool import avg_pool_nhwc_backward_ok

CL = torch.channels_last
POOL = dict(kernel_size=3, stride=1, padding=1, count_include_pad=False)


def _dx(pool, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(pool(x), x, dy)
    return dx


def _case():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 512, 7, 7, device="cuda", generator=gen)
    dy = torch.randn(64, 512, 7, 7, device="cuda", generator=gen)
    want = _dx(lambda t: F.avg_pool2d(t, **POOL), x, dy)  # NCHW: right with or without the bug
    return x, dy, want


@pytest.mark.gpu
@pytest.mark.parametrize("forced", [False, True], ids=["as-installed", "nchw-backward-forced"])
def test_channels_last_gradient_equals_the_nchw_one(monkeypatch, forced):
    if forced:  # the guarded path, whatever this PyTorch does
        monkeypatch.setattr(avg_pool, "avg_pool_nhwc_backward_ok", lambda device: False)
    x, dy, want = _case()
    dx = _dx(LayoutSafeAvgPool2d(**POOL), x.contiguous(memory_format=CL), dy.to(memory_format=CL))
    torch.testing.assert_close(dx, want, rtol=1e-5, atol=1e-6)
    assert dx.is_contiguous(memory_format=CL)


@pytest.mark.gpu
def test_the_check_agrees_with_pytorchs_own_nhwc_gradient():
    ok = avg_pool_nhwc_backward_ok("cuda")
    assert isinstance(ok, bool)
    assert avg_pool_nhwc_backward_ok(torch.device("cuda", torch.cuda.current_device())) is ok
    x, dy, want = _case()
    nhwc = _dx(lambda t: F.avg_pool2d(t, **POOL), x.contiguous(memory_format=CL), dy)
    assert torch.allclose(nhwc, want, rtol=1e-5, atol=1e-6) is ok
