"""A strided convolution on few input channels, computed as a stride-1 convolution over a
space-to-depth view of its input: the module s2d-stem puts in place of an RGB stem.

With stride s, pad the input by the convolution's padding (and a little more at the bottom and
right, so that every output's window is inside and the sides divide by s), fold each s x s block
of pixels into the channels (`pixel_unshuffle`: C -> C s^2), and fold the k x k kernel, zero-
padded to K s x K s with K = ceil(k / s), the same way:

    W'[o, c s^2 + i s + j, a, b] = w[o, c, s a + i, s b + j]     (0 past the kernel's edge)

A stride-1 K x K convolution of the folded input with W' sums exactly the products the original
sums, so outputs and gradients are the same up to the order of the additions. The folded
channels are zero-padded to a multiple of `align` (12 -> 16 for an RGB 7x7/2 stem), which the
tensor cores take as they are; cuDNN otherwise pads a 3-channel input to 8 itself on every call
and runs an older, slower kernel. ResNet-50's 7x7/2 stem: (7 -> 8)^2 / 49 = 1.31x the
multiply-adds (+0.9% of the model's), 1.35x faster forward and weight gradient on an H100
(benchmarks/kernels/probe_stem.py).

The module keeps the original convolution's Parameters (the same objects, the same names), so
the state_dict, a checkpoint and an optimizer made before the swap are unchanged; the weight is
folded on every call (a few small kernels, differentiable).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def why_not(conv: nn.Module, align: int) -> str | None:
    """Why `conv` cannot run space-to-depth (None: it can)."""
    if type(conv) is not nn.Conv2d:
        return f"{type(conv).__name__} is not exactly nn.Conv2d (a subclass may compute otherwise)"
    (sh, sw), (kh, kw) = _pair(conv.stride), _pair(conv.kernel_size)
    if conv.groups != 1:
        return f"grouped (groups={conv.groups})"
    if _pair(conv.dilation) != (1, 1):
        return f"dilated ({conv.dilation})"
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r} (only zero padding folds)"
    if isinstance(conv.padding, str):
        return f"padding={conv.padding!r} (needs explicit padding)"
    if sh != sw or sh < 2:
        return f"stride {conv.stride} (needs an equal stride of 2 or more)"
    if kh <= sh or kw <= sw:
        return f"kernel {conv.kernel_size} not larger than its stride (a patch convolution)"
    if conv.in_channels >= align:
        return f"{conv.in_channels} input channels (only fewer than {align} are slow)"
    return None


def layout(x: torch.Tensor) -> torch.memory_format:
    """channels_last where `x` is laid out so (and not plainly contiguous), else contiguous."""
    nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if nhwc else torch.contiguous_format


def fold_weight(w: torch.Tensor, stride: int, channels: int) -> torch.Tensor:
    """(O, C, kh, kw) -> (O, `channels`, ceil(kh/s), ceil(kw/s)): the kernel of the stride-1
    convolution over the space-to-depth input (see the module docstring); channels past C s^2
    are zeros."""
    o, c, kh, kw = w.shape
    s = stride
    a, b = math.ceil(kh / s), math.ceil(kw / s)
    padded = F.pad(w, (0, b * s - kw, 0, a * s - kh))  # (O, C, a s, b s)
    folded = padded.reshape(o, c, a, s, b, s).permute(0, 1, 3, 5, 2, 4).reshape(o, c * s * s, a, b)
    if channels > c * s * s:
        folded = F.pad(folded, (0, 0, 0, 0, 0, channels - c * s * s))
    return folded


def fold_input(
    x: torch.Tensor,
    kernel: tuple[int, int],
    stride: int,
    padding: tuple[int, int],
    channels: int,
    memory_format: torch.memory_format | None = None,
) -> torch.Tensor:
    """The convolution's input padded, folded s x s into the channels, zero channels up to
    `channels`, in `memory_format` (default: the input's, channels_last or contiguous): what
    the folded kernel runs over at stride 1."""
    memory_format = memory_format or layout(x)
    s = stride
    (kh, kw), (ph, pw) = kernel, padding
    h, w = x.shape[-2:]
    out_h, out_w = (h + 2 * ph - kh) // s + 1, (w + 2 * pw - kw) // s + 1
    # rows the folded windows cover: (out + K - 1) blocks of s; past the input, zeros (or cut)
    rows = (out_h + math.ceil(kh / s) - 1) * s
    cols = (out_w + math.ceil(kw / s) - 1) * s
    x = F.pad(x, (pw, cols - w - pw, ph, rows - h - ph))
    folded = F.pixel_unshuffle(x, s)
    extra = channels - folded.shape[1]
    if extra > 0:
        folded = F.pad(folded, (0, 0, 0, 0, 0, extra))
    return folded.contiguous(memory_format=memory_format)


class SpaceToDepthFold(nn.Module):
    """`fold_input` as a module, so that the trace tells its copies apart (the cost model prices
    them at the rate the probe measured for them, memory family `s2d_fold`)."""

    def __init__(
        self, kernel: tuple[int, int], stride: int, padding: tuple[int, int], channels: int
    ):
        super().__init__()
        self.kernel, self.stride, self.padding, self.channels = kernel, stride, padding, channels

    def forward(
        self, x: torch.Tensor, memory_format: torch.memory_format | None = None
    ) -> torch.Tensor:
        return fold_input(x, self.kernel, self.stride, self.padding, self.channels, memory_format)

    def extra_repr(self) -> str:
        return f"stride={self.stride}, padding={self.padding}, channels={self.channels}"


class SpaceToDepthConv2d(nn.Module):
    """An nn.Conv2d (stride s >= 2, fewer input channels than `align`) computed as a stride-1
    convolution over its input folded s x s into the channels. Holds the convolution's own
    `weight` and `bias` Parameters."""

    def __init__(self, conv: nn.Conv2d, align: int = 8) -> None:
        super().__init__()
        reason = why_not(conv, align)
        if reason is not None:
            raise ValueError(f"SpaceToDepthConv2d: cannot take this convolution: {reason}")
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size = _pair(conv.kernel_size)
        self.stride = _pair(conv.stride)[0]
        self.padding = _pair(conv.padding)
        folded = conv.in_channels * self.stride**2
        self.channels = -(-folded // align) * align  # the folded channels, aligned
        self.fold = SpaceToDepthFold(self.kernel_size, self.stride, self.padding, self.channels)
        self.weight = conv.weight
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"SpaceToDepthConv2d: expected (N, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        # the layout the original convolution would run and return in (channels_last where its
        # input or its weight is): a channels_last output would turn an NCHW model channels_last
        # downstream, a change of layout that is not this module's to make
        nhwc = torch.channels_last in (layout(x), layout(self.weight))
        memory_format = torch.channels_last if nhwc else torch.contiguous_format
        folded = self.fold(x, memory_format)
        weight = fold_weight(self.weight, self.stride, self.channels)
        return F.conv2d(folded, weight.contiguous(memory_format=memory_format), self.bias)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, as a stride-1 "
            f"{math.ceil(self.kernel_size[0] / self.stride)}x"
            f"{math.ceil(self.kernel_size[1] / self.stride)} convolution on {self.channels} "
            "space-to-depth channels"
        )
