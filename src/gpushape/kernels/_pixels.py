"""What the kernels that reduce an activation over its pixels share (GRN, group norm): the
tensor seen as (N, P, C), the tile a program takes, and how the pixels split over programs.

A 4-D activation is N samples of P = H*W pixels and C channels, with element strides
(sn, sp, sc); one of pixels or channels is contiguous. A program of a per-(sample, channel)
reduction takes a (pixels, channels) tile, the contiguous axis first up to its cap, and the
pixels are cut into slices until the GPU has `PROGRAMS_PER_SM` programs an SM, each summing
its slice into a partial of its own (no atomics: the same sums in the same order every run).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

MAX_BLOCK_C = 64  # channels fastest: channels a tile spans (128 bytes of bf16)
MAX_BLOCK_P = 256  # pixels fastest: pixels a tile spans
MIN_BLOCK = 16
PROGRAMS_PER_SM = 4  # the sums kernels split the pixels until they have this many programs an SM


class View(NamedTuple):
    """x as (N, P, C): sizes, element strides, and which of pixels or channels is contiguous."""

    n: int
    p: int
    c: int
    sn: int
    sp: int
    sc: int
    channels_fastest: bool


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the sums and per-sample arithmetic run in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def pow2(n: int) -> int:
    """The power of two at or above n, at least MIN_BLOCK."""
    return max(MIN_BLOCK, 1 << max(0, n - 1).bit_length())


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # Triton's interpreter: a few slices, so the split path is tested


def tile(v: View, elems: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C): the contiguous axis first, up to its cap, the other filling the tile."""
    if v.channels_fastest:
        block_c = min(pow2(v.c), MAX_BLOCK_C)
        return min(pow2(v.p), max(MIN_BLOCK, elems // block_c)), block_c
    block_p = min(pow2(v.p), MAX_BLOCK_P)
    return block_p, min(pow2(v.c), max(MIN_BLOCK, elems // block_p))


class Split(NamedTuple):
    """A per-(sample, channel) reduction's launch: `programs` (samples x channel blocks) by
    `splits` slices of `p_per_split` pixels (a multiple of block_p), tile (block_p, block_c)."""

    block_p: int
    block_c: int
    programs: int
    p_per_split: int
    splits: int


def split(v: View, elems: int, device: torch.device) -> Split:
    """Tiles of `elems` elements, and the pixels cut into slices until the GPU is full."""
    block_p, block_c = tile(v, elems)
    programs = v.n * -(-v.c // block_c)
    slices = -(-v.p // block_p)
    wanted = -(-PROGRAMS_PER_SM * sm_count(device) // max(programs, 1))
    splits = max(1, min(wanted, slices))
    p_per_split = -(-slices // splits) * block_p
    return Split(block_p, block_c, programs, p_per_split, -(-v.p // p_per_split))
