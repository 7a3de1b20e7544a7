"""Average pooling whose input gradient is right for channels_last CUDA tensors with padding,
where PyTorch's own is not (pytorch/pytorch#188344, a fix proposed in #188345).

PyTorch's CUDA kernel for avg_pool2d's backward in channels_last (NHWC) memory,
`avg_pool2d_backward_out_cuda_frame_nhwc`, forgets the padding offset: with padding > 0 every
input pixel takes the gradients of the wrong windows. The forward is right; NCHW is right;
padding 0 is right; the CPU is right. Measured on an H100 (torch 2.11): in timm's
PoolFormerV2-S12 (token mixer `pool(y) - y`, `nn.AvgPool2d(3, 1, 1, count_include_pad=False)`),
once gpushape's GroupNormAct kept the norms' outputs channels_last, the gradient reaching the
stage-3 norms was 190-310 % (relative L2) off and parameter gradients all over the model were
wrong, while gpushape's own kernels on those tensors were right to 1e-7.

`avg_pool_nhwc_backward_ok(device)` measures whether the installed PyTorch has the bug on a
device (version numbers cannot say: fixes get backported), once per device.
`LayoutSafeAvgPool2d` is `nn.AvgPool2d` (a subclass: same arguments, repr fields and empty
state_dict) whose forward, only where the bug would hit (a CUDA input PyTorch may run in its
NHWC kernel, padding > 0, a gradient wanted, eager, the check failed on that device), runs
`F.avg_pool2d` forward and takes the input gradient from PyTorch's NCHW backward, converted
back to the input's layout: two copies of the gradient, no saved input (the backward reads only
the input's shape). Everywhere else it is `nn.AvgPool2d.forward`, op for op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._prims_common import suggest_memory_format  # ATen's rule, written in Python
from torch.nn.modules.utils import _pair

from .._dispatch import functorch_active

__all__ = ["LayoutSafeAvgPool2d", "avg_pool_nhwc_backward_ok"]

AFFECTED_DEVICES = frozenset({"cuda"})
"""Device types whose PyTorch kernels may have the bug (ROCm's run as "cuda" too)."""

_CHECKED: dict[torch.device, bool] = {}


# ---- the check ------------------------------------------------------------------------------
def avg_pool_nhwc_backward_ok(device: torch.device | str | int | None = None) -> bool:
    """Whether PyTorch's avg_pool2d backward on `device` gives a channels_last input the same
    gradient as its NCHW copy, with padding (pytorch#188344). Measured once per device and
    cached; True on the CPU, meta and any device that is not CUDA, and without CUDA. During
    CUDA graph capture an unmeasured device reads as broken (measuring would synchronise):
    the NCHW backward is right either way."""
    device = torch.device("cuda" if device is None else device)
    if device.type not in AFFECTED_DEVICES or not _available(device):
        return True
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _CHECKED:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
        _CHECKED[device] = nhwc_matches_nchw(device)
    return _CHECKED[device]


def _available(device: torch.device) -> bool:
    return device.type != "cuda" or torch.cuda.is_available()


def nhwc_matches_nchw(device: torch.device | str, pool=F.avg_pool2d) -> bool:
    """The measurement: the input gradient of `pool(x, 3, 1, 1, count_include_pad=False)` for a
    fixed 2 x 8 x 5 x 5 float32 x in channels_last against its NCHW copy's, equal to rounding
    (the bug moves whole windows: errors of the gradients' own size)."""
    with torch.inference_mode(False), torch.enable_grad():
        n = 2 * 8 * 5 * 5
        x = (torch.arange(n, dtype=torch.float32) * 0.37).sin().reshape(2, 8, 5, 5).to(device)
        dy = (torch.arange(n, dtype=torch.float32) % 7 + 1).reshape(2, 8, 5, 5).to(device)

        def grad(fmt: torch.memory_format) -> Tensor:
            xi = x.contiguous(memory_format=fmt).requires_grad_()
            y = pool(xi, 3, 1, 1, count_include_pad=False)
            (dx,) = torch.autograd.grad(y, xi, dy.contiguous(memory_format=fmt))
            return dx

        nchw, nhwc = grad(torch.contiguous_format), grad(torch.channels_last)
        return bool(torch.allclose(nhwc, nchw, rtol=1e-5, atol=1e-6))


# ---- the guarded pool -----------------------------------------------------------------------
def nhwc_like(x: Tensor) -> bool:
    """A 4-D tensor PyTorch may pool in its NHWC kernels: channels_last strides (one channel
    or a 1 x 1 map counts: contiguous both ways) or no NCHW-contiguous strides at all."""
    return x.dim() == 4 and (
        not x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)
    )


def needs_nchw_backward(x: Tensor, padding) -> bool:
    """Whether pooling `x` with `padding` would meet pytorch#188344: see the module docstring."""
    return (
        isinstance(x, Tensor)
        and x.device.type in AFFECTED_DEVICES
        and any(p > 0 for p in _pair(padding))
        and torch.is_grad_enabled()
        and x.requires_grad
        and nhwc_like(x)
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not functorch_active()
        and not avg_pool_nhwc_backward_ok(x.device)
    )


class _NchwBackwardAvgPool2d(torch.autograd.Function):
    """F.avg_pool2d forward; the input gradient from PyTorch's NCHW backward kernel."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override):  # fmt: skip
        ctx.args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        # the input itself is not kept: the backward reads its shape and layout only
        ctx.shape, ctx.dtype, ctx.format = x.shape, x.dtype, suggest_memory_format(x)
        return F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)  # fmt: skip

    @staticmethod
    def backward(ctx, dy: Tensor):
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override = ctx.args
        nchw = torch.empty(ctx.shape, dtype=ctx.dtype, device=dy.device)  # never read
        dx = torch.ops.aten.avg_pool2d_backward(
            dy.contiguous(), nchw, _pair(kernel_size), _pair(stride), _pair(padding),
            ceil_mode, count_include_pad, divisor_override,
        )  # fmt: skip
        return dx.contiguous(memory_format=ctx.format), None, None, None, None, None, None


class LayoutSafeAvgPool2d(nn.AvgPool2d):
    """nn.AvgPool2d whose input gradient is right where PyTorch's NHWC backward is not
    (pytorch#188344; see the module docstring). Same constructor, attributes, repr fields and
    (empty) state_dict as nn.AvgPool2d, of which it is a subclass."""

    @classmethod
    def from_module(cls, pool: nn.AvgPool2d) -> LayoutSafeAvgPool2d:
        """A LayoutSafeAvgPool2d with `pool`'s settings and train/eval state."""
        if not isinstance(pool, nn.AvgPool2d):
            raise TypeError(f"from_module: expected nn.AvgPool2d, got {type(pool).__name__}")
        new = cls(pool.kernel_size, pool.stride, pool.padding, pool.ceil_mode,
                  pool.count_include_pad, pool.divisor_override)  # fmt: skip
        new.train(pool.training)
        return new

    def forward(self, x: Tensor) -> Tensor:
        if needs_nchw_backward(x, self.padding):
            return _NchwBackwardAvgPool2d.apply(
                x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                self.count_include_pad, self.divisor_override,
            )  # fmt: skip
        return super().forward(x)
