"""What max_pool2d's kernels, reference and checks share: the window geometry, the memory
format of the outputs, and the argument and input checks (one-line errors, run before any op).

A window's taps are numbered row-major, tap = kh * KW + kw, and stored as int8: the kernel
window may hold at most 127 taps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._prims_common import suggest_memory_format  # ATen's rule, written in Python

from .._dispatch import check_float

MAX_TAPS = 127  # int8 tap index
_OP = "max_pool2d"
_DEVICES = ("cpu", "cuda", "meta")


@dataclass(frozen=True)
class Pool2d:
    """One max-pool's window: kernel (KH, KW), stride (SH, SW), padding (PH, PW); dilation 1."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]

    def output_size(self, h: int, w: int) -> tuple[int, int]:
        """(OH, OW) with ceil_mode=False: floor((H + 2 PH - KH) / SH) + 1."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1

    def as_lists(self) -> tuple[list[int], list[int], list[int]]:
        """kernel, stride, padding as the custom ops take them (int[] in the schema)."""
        return list(self.kernel), list(self.stride), list(self.padding)

    @classmethod
    def of_lists(cls, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int]):
        return cls(tuple(kernel), tuple(stride), tuple(padding))


# ---- layout --------------------------------------------------------------------------------
def channels_last(x: torch.Tensor) -> bool:
    """x's outputs (and dx) are channels_last: ATen's suggest_memory_format, which is what
    F.max_pool2d follows (a tensor that is both, C = 1 or H = W = 1, counts as NCHW)."""
    cl = x.is_contiguous(memory_format=torch.channels_last)
    if cl != x.is_contiguous():  # the common case, decided without Python stride walks
        return cl
    return suggest_memory_format(x) == torch.channels_last


def memory_format(is_channels_last: bool) -> torch.memory_format:
    return torch.channels_last if is_channels_last else torch.contiguous_format


def dense(x: torch.Tensor, is_channels_last: bool) -> torch.Tensor:
    """x laid out as the kernels read it (a no-op for a dense NCHW or channels_last x)."""
    return x.contiguous(memory_format=memory_format(is_channels_last))


# ---- arguments -----------------------------------------------------------------------------
def _pair(name: str, value, *, minimum: int) -> tuple[int, int]:
    items = (value, value) if isinstance(value, int) else value
    ok = isinstance(items, (tuple, list)) and len(items) in (1, 2)
    if ok:
        items = (items[0], items[0]) if len(items) == 1 else tuple(items)
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in items)
    if not ok:
        raise TypeError(f"{_OP}: {name} must be an int or a pair of ints, got {value!r}")
    if min(items) < minimum:
        bound = "positive" if minimum == 1 else ">= 0"
        raise ValueError(f"{_OP}: {name} must be {bound}, got {value!r}")
    return items


def pool_geometry(
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Pool2d:
    """F.max_pool2d's arguments checked and normalised; ValueError for what the kernels do not
    do (dilation, ceil_mode, return_indices, a window past 127 taps) or PyTorch refuses."""
    kernel = _pair("kernel_size", kernel_size, minimum=1)
    empty = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    strides = kernel if empty else _pair("stride", stride, minimum=1)
    pads = _pair("padding", padding, minimum=0)
    if _pair("dilation", dilation, minimum=1) != (1, 1):
        raise ValueError(
            f"{_OP}: dilation={dilation!r} is not supported (only 1); "
            "use torch.nn.functional.max_pool2d"
        )
    if ceil_mode:
        raise ValueError(
            f"{_OP}: ceil_mode=True is not supported; use torch.nn.functional.max_pool2d"
        )
    if return_indices:
        raise ValueError(
            f"{_OP}: return_indices=True is not supported (the kernels keep an int8 window "
            "position, not PyTorch's int64 index); use torch.nn.functional.max_pool2d"
        )
    if any(2 * p > k for p, k in zip(pads, kernel)):
        raise ValueError(
            f"{_OP}: padding must be at most half the kernel size (as in PyTorch), "
            f"got padding={pads} for kernel_size={kernel}"
        )
    if kernel[0] * kernel[1] > MAX_TAPS:
        raise ValueError(
            f"{_OP}: a {kernel[0]}x{kernel[1]} window has {kernel[0] * kernel[1]} taps, more "
            f"than the {MAX_TAPS} an int8 index holds; use torch.nn.functional.max_pool2d"
        )
    return Pool2d(kernel, strides, pads)


def check_input(x: torch.Tensor, geom: Pool2d) -> None:
    """x: a float (N, C, H, W) or (C, H, W) tensor on the CPU, a CUDA device or meta, whose
    windows fit (non-empty output); N may be 0."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_OP}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type not in _DEVICES:
        raise RuntimeError(f"{_OP}: x is on {x.device}; expected CPU or CUDA tensors")
    check_float(_OP, x=x)
    if x.dim() not in (3, 4):
        raise ValueError(
            f"{_OP}: expected a 4-D (N, C, H, W) or 3-D (C, H, W) input, "
            f"got {x.dim()}-D of shape {tuple(x.shape)}"
        )
    c, h, w = x.shape[-3:]
    if c == 0 or h == 0 or w == 0:
        raise ValueError(
            f"{_OP}: C, H and W must be non-zero (only the batch may be empty), "
            f"got shape {tuple(x.shape)}"
        )
    oh, ow = geom.output_size(h, w)
    if oh < 1 or ow < 1:
        raise ValueError(
            f"{_OP}: input {h}x{w} with padding {geom.padding} is smaller than the "
            f"{geom.kernel[0]}x{geom.kernel[1]} window: the output would be {oh}x{ow}"
        )
