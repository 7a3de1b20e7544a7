"""Launchers of the max_pool2d kernels: layout, tile, grid and outputs, worked out once per
signature (a plan) so a call allocates its outputs and launches one kernel.

Traffic (S_x, S_y: the bytes of x and y; E_y: y's elements):
  forward:  read x, write y and E_y int8 taps       = S_x + S_y + E_y
  inference forward (no taps written)                = S_x + S_y
  backward: read the taps and dy, write dx          = E_y + S_y + S_x
CPU tensors take the plain-PyTorch reference (`_reference.py`) unless TRITON_INTERPRET=1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._dispatch import use_triton
from .._launch import Launch, aligned
from .._plan_cache import PlanCache
from ._geometry import Pool2d, channels_last, dense, memory_format
from ._kernels import _max_pool_bwd_kernel, _max_pool_fwd_kernel
from ._reference import reference_backward, reference_forward

TILE_ELEMS = 2048  # elements a program handles: 16 a thread at 4 warps
NUM_WARPS = 4
MAX_BLOCK_C = 128  # channels_last: channels a tile spans
MAX_BLOCK_P = 1024  # NCHW: pixels a tile spans
_INT32_LIMIT = 2**31
_MAX_PLANS = 1024  # signatures; a network has a few


class TileConfig(NamedTuple):
    block_p: int
    block_c: int
    num_warps: int


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def tile_config(n_pix: int, n_ch: int, is_channels_last: bool) -> TileConfig:
    """channels_last: all channels (up to 128) a pixel, as many pixels as fill the tile; NCHW:
    a plane's pixels (up to 1024), as many planes as fill the tile."""
    if is_channels_last:
        block_c = min(_pow2(n_ch), MAX_BLOCK_C)
        return TileConfig(max(1, TILE_ELEMS // block_c), block_c, NUM_WARPS)
    block_p = min(_pow2(n_pix), MAX_BLOCK_P)
    return TileConfig(block_p, max(1, TILE_ELEMS // block_p), NUM_WARPS)


class Plan(NamedTuple):
    launch: Launch
    sizes: tuple[int, ...]  # C, H, W, OH, OW, n_pix, n_ch
    out_shape: tuple[int, int, int, int]  # the launch's output: y (forward) or dx (backward)


_PLANS: PlanCache[Plan] = PlanCache(_MAX_PLANS)


def plan(
    backward: bool,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    geom: Pool2d,
    is_channels_last: bool,
    write_index: bool = True,
) -> Plan:
    """The cached launch of one direction for an (N, C, H, W) input of this dtype and layout."""
    key = (backward, tuple(shape), dtype, device, geom, is_channels_last, write_index)
    return _PLANS.get(key, _build, key)


def _build(key: tuple) -> Plan:
    backward, shape, dtype, _device, geom, is_channels_last, write_index = key
    n, c, h, w = shape
    oh, ow = geom.output_size(h, w)
    walked = (h, w) if backward else (oh, ow)  # the grid the tile's pixels run over
    n_pix = walked[0] * walked[1] * (n if is_channels_last else 1)
    n_ch = c if is_channels_last else n * c
    cfg = tile_config(n_pix, n_ch, is_channels_last)
    grid = -(-n_pix // cfg.block_p) * -(-n_ch // cfg.block_c)
    (kh, kw), (sh, sw), (ph, pw) = geom.kernel, geom.stride, geom.padding
    meta = dict(
        KH=kh,
        KW=kw,
        SH=sh,
        SW=sw,
        PH=ph,
        PW=pw,
        BLOCK_P=cfg.block_p,
        BLOCK_C=cfg.block_c,
        CHANNELS_LAST=is_channels_last,
        WIDE=n * c * max(h * w, oh * ow) >= _INT32_LIMIT,
        num_warps=cfg.num_warps,
    )
    if backward:
        kernel = _max_pool_bwd_kernel
        meta["ACC_FP64"] = dtype == torch.float64
    else:
        kernel = _max_pool_fwd_kernel
        meta["WRITE_INDEX"] = write_index
    out_shape = (n, c, h, w) if backward else (n, c, oh, ow)
    return Plan(Launch(kernel, grid, meta), (c, h, w, oh, ow, n_pix, n_ch), out_shape)


def max_pool_forward(
    x: torch.Tensor, geom: Pool2d, cl: bool | None = None, write_index: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, taps) of a 4-D x, both in x's layout (`cl`: channels_last(x), worked out when not
    given); taps int8, None when write_index is off on the Triton path (inference)."""
    cl = channels_last(x) if cl is None else cl
    x = dense(x, cl)
    if not use_triton(x):
        return reference_forward(x, geom, cl)
    p = plan(False, x.shape, x.dtype, x.device, geom, cl, write_index)
    fmt = memory_format(cl)
    y = torch.empty(p.out_shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    taps = torch.empty(p.out_shape, dtype=torch.int8, device=x.device, memory_format=fmt)
    if y.numel() == 0:
        return y, taps
    if not write_index:
        p.launch(aligned(x, y), x, y, y, *p.sizes)  # idx_ptr unused: y stands in
        return y, None
    p.launch(aligned(x, y, taps), x, y, taps, *p.sizes)
    return y, taps


def max_pool_backward(
    dy: torch.Tensor,
    taps: torch.Tensor,
    input_hw: tuple[int, int],
    geom: Pool2d,
    is_channels_last: bool,
) -> torch.Tensor:
    """dx (N, C, H, W) in dy's dtype, laid out channels_last or NCHW as the input was."""
    dy, taps = dense(dy, is_channels_last), dense(taps, is_channels_last)
    if not use_triton(dy):
        return reference_backward(dy, taps, input_hw, geom, is_channels_last)
    n, c = taps.shape[:2]
    shape = (n, c, *input_hw)
    p = plan(True, shape, dy.dtype, dy.device, geom, is_channels_last)
    fmt = memory_format(is_channels_last)
    dx = torch.empty(shape, dtype=dy.dtype, device=dy.device, memory_format=fmt)
    if dx.numel() == 0:
        return dx
    p.launch(aligned(dy, taps, dx), dy, taps, dx, *p.sizes)
    return dx
