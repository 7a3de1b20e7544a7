"""Max pooling over 2-D windows, y = F.max_pool2d(x, kernel_size, stride, padding), with a
backward that reads a 1-byte window position per output instead of PyTorch's int64 index.

    y[n, c, oh, ow] = max over kh < KH, kw < KW of x[n, c, oh*SH - PH + kh, ow*SW - PW + kw]

(padding taps count as -inf and are never chosen; dilation 1, ceil_mode=False). The forward
also writes each maximum's tap kh*KW + kw as int8; the backward gathers: every input pixel
sums, in float32, the gradients of the (at most ceil(KH/SH) x ceil(KW/SW)) windows whose saved
tap is that pixel: no atomics, deterministic. Ties and NaN follow PyTorch: the first maximum in
row-major window order wins a tie, a NaN in the window makes y NaN and takes the gradient (the
last NaN, as PyTorch); see `_kernels.py` for where PyTorch's CUDA kernels differ.

Minimum bytes (S_x, S_y: the bytes of x and y; E_y: y's elements, one tap byte each):
  forward:  read x, write y and the taps            S_x + S_y + E_y
  backward: read the taps and dy, write dx          E_y + S_y + S_x
  (inference, no gradient wanted: read x, write y   S_x + S_y)
ResNet-50's stem pool (256x64x112x112 -> 56x56, bf16) moves 565 MB each way; PyTorch's int64
index (8 bytes an output, not 1) adds 360 MB to each.

Supported: 4-D (N, C, H, W) or 3-D (C, H, W) input, float32 / float16 / bfloat16 (float64
too), NCHW or channels_last (other strides are copied into the layout PyTorch would give the
output); the output and dx keep that layout. Unsupported settings (dilation, ceil_mode,
return_indices, a window of more than 127 taps) raise ValueError from the functional form and
from the module's constructor: no silent fallback to PyTorch's slower kernel.

Layers: Triton kernels (`_kernels.py`), launchers (`_launch.py`) with the plain-PyTorch
reference for CPU tensors (`_reference.py`), checks and window arithmetic (`_geometry.py`);
here the custom ops gpushape::max_pool2d and gpushape::max_pool2d_backward (fake
implementations, registered autograd: torch.compile, CUDA graphs, meta tensors), the eager
autograd.Function, the functional `max_pool2d` and the module `MaxPool2d`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .._dispatch import eager_path, functorch_active
from ._geometry import Pool2d, channels_last, check_input, dense, memory_format, pool_geometry
from ._launch import max_pool_backward, max_pool_forward

__all__ = ["MaxPool2d", "max_pool2d", "max_pool2d_backward_op", "max_pool2d_op"]


# ---- custom ops: what torch.compile and meta tensors go through -----------------------------
@torch.library.custom_op("gpushape::max_pool2d", mutates_args=())
def max_pool2d_op(
    x: Tensor, kernel_size: list[int], stride: list[int], padding: list[int]
) -> tuple[Tensor, Tensor]:
    """(y, taps) of a 4-D x, in x's layout; taps int8 (kh * KW + kw of each maximum)."""
    y, taps = max_pool_forward(x, Pool2d.of_lists(kernel_size, stride, padding))
    return y, taps


def _empty(x: Tensor, shape, dtype: torch.dtype, is_channels_last: bool) -> Tensor:
    fmt = memory_format(is_channels_last)
    return torch.empty(shape, dtype=dtype, device=x.device, memory_format=fmt)


@max_pool2d_op.register_fake
def _(x, kernel_size, stride, padding):
    n, c, h, w = x.shape
    oh, ow = Pool2d.of_lists(kernel_size, stride, padding).output_size(h, w)
    cl = channels_last(x)
    return _empty(x, (n, c, oh, ow), x.dtype, cl), _empty(x, (n, c, oh, ow), torch.int8, cl)


@torch.library.custom_op("gpushape::max_pool2d_backward", mutates_args=())
def max_pool2d_backward_op(
    dy: Tensor,
    taps: Tensor,
    input_hw: list[int],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    is_channels_last: bool,
) -> Tensor:
    """dx (N, C, H, W) from dy and the forward's taps, channels_last or NCHW."""
    geom = Pool2d.of_lists(kernel_size, stride, padding)
    return max_pool_backward(dy, taps, tuple(input_hw), geom, is_channels_last)


@max_pool2d_backward_op.register_fake
def _(dy, taps, input_hw, kernel_size, stride, padding, is_channels_last):
    return _empty(dy, (*taps.shape[:2], *input_hw), dy.dtype, is_channels_last)


def _setup_context(ctx, inputs, output):
    x, kernel_size, stride, padding = inputs
    ctx.save_for_backward(output[1])
    ctx.pool_args = (list(x.shape[-2:]), kernel_size, stride, padding, channels_last(x))
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # the taps never get a gradient: no zeros built


def _backward(ctx, dy, _dtaps):
    if dy is None:
        return None, None, None, None
    (taps,) = ctx.saved_tensors
    return max_pool2d_backward_op(dy, taps, *ctx.pool_args), None, None, None


max_pool2d_op.register_autograd(_backward, setup_context=_setup_context)


# ---- eager path: one autograd.Function straight to the launchers ----------------------------
class _MaxPool2dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, geom: Pool2d, is_channels_last: bool) -> Tensor:
        y, taps = max_pool_forward(x, geom, is_channels_last)
        ctx.save_for_backward(taps)
        ctx.geom, ctx.input_hw, ctx.is_channels_last = geom, tuple(x.shape[-2:]), is_channels_last
        return y

    @staticmethod
    @once_differentiable  # the backward kernel has no derivative of its own
    def backward(ctx, dy: Tensor):
        (taps,) = ctx.saved_tensors
        dx = max_pool_backward(dy, taps, ctx.input_hw, ctx.geom, ctx.is_channels_last)
        return dx, None, None


def _pool(x: Tensor, geom: Pool2d) -> Tensor:
    """max_pool2d of a checked 4-D x."""
    if functorch_active():  # torch.func: PyTorch's own op, which the transforms understand
        return F.max_pool2d(x, geom.kernel, geom.stride, geom.padding)
    cl = channels_last(x)
    x = dense(x, cl)
    if eager_path(x):
        if torch.is_grad_enabled() and x.requires_grad:
            return _MaxPool2dFn.apply(x, geom, cl)
        return max_pool_forward(x, geom, cl, write_index=False)[0]
    return max_pool2d_op(x, *geom.as_lists())[0]


# ---- functional and module ------------------------------------------------------------------
def max_pool2d(
    x: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor:
    """torch.nn.functional.max_pool2d(x, kernel_size, stride, padding) with the int8-index
    kernels (see the module docstring). stride defaults to kernel_size; dilation, ceil_mode and
    return_indices exist for F.max_pool2d's signature and must keep their defaults
    (ValueError otherwise)."""
    geom = pool_geometry(kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    check_input(x, geom)
    if x.dim() == 3:  # unbatched (C, H, W)
        return _pool(x.unsqueeze(0), geom).squeeze(0)
    return _pool(x, geom)


class MaxPool2d(nn.Module):
    """nn.MaxPool2d(kernel_size, stride, padding) with the int8-index kernels: a drop-in for
    nn.MaxPool2d with dilation=1, ceil_mode=False, return_indices=False (others raise
    ValueError here, at construction). No parameters or buffers: the state_dict is empty, as
    nn.MaxPool2d's."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ):
        super().__init__()
        pool_geometry(kernel_size, stride, padding, dilation, ceil_mode, return_indices)
        # the attributes nn.MaxPool2d has, under its names and with its values
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    @classmethod
    def from_torch(cls, module: nn.MaxPool2d) -> MaxPool2d:
        """A MaxPool2d with module's settings (ValueError for those the kernels lack)."""
        if not isinstance(module, nn.MaxPool2d):
            raise TypeError(f"from_torch: expected nn.MaxPool2d, got {type(module).__name__}")
        return cls(
            module.kernel_size,
            module.stride,
            module.padding,
            module.dilation,
            module.return_indices,
            module.ceil_mode,
        )

    def forward(self, x: Tensor) -> Tensor:
        return max_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil_mode,
            self.return_indices,
        )

    def extra_repr(self) -> str:  # nn.MaxPool2d's, word for word
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )
