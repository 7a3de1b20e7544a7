"""Launchers for the batch_norm_act Triton kernels: layout, tile sizes, grids, buffers.

Traffic per call, in passes over one (N, C, H, W) tensor (ReLU mask bits cost 1/16 of a pass):
  training forward:  read x (stats); read x, residual; write y, bits   = 4 + 1/16
  training backward: read dy, x, bits (sums); read dy, x, bits; write dx, d_residual = 6 + 1/8
  eval forward: 3 (+1/16), eval backward: 4 (+1/16) — with residual and ReLU.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
from dataclasses import dataclass

import torch

from ._batch_norm_bwd_kernels import _bwd_apply_kernel, _bwd_finalize_kernel, _bwd_reduce_kernel
from ._batch_norm_kernels import _apply_kernel, _stats_finalize_kernel, _stats_kernel


@dataclass(frozen=True)
class BatchNormTuning:
    """Launch heuristics (benchmarks sweep them with `batch_norm_tuning`).

    Reductions: 2 sub-tiles of 4 KiB in flight per trip on 4 warps keep the accumulators at
    2x16 fp32 registers a thread, so many programs fit an SM; the grid is `reduce_waves` waves of
    resident programs (one wave: no tail of late programs). Elementwise passes: 16 KiB a program
    on 8 warps (32 elements, 4 x 16-byte loads a thread and tensor). Widest channel block: 128
    (reductions) / 256 (elementwise) channels keeps rows of 256-512 contiguous bytes in
    channels_last while leaving enough channel blocks for small N*H*W.
    """

    reduce_tile_bytes: int = 4096
    reduce_warps: int = 4
    reduce_max_block_c: int = 128
    reduce_waves: int = 1
    apply_tile_bytes: int = 16384
    apply_warps: int = 8
    apply_max_block_c: int = 256


_TUNING = BatchNormTuning()


@contextlib.contextmanager
def batch_norm_tuning(**changes):
    """Run the block under other launch heuristics (fields of BatchNormTuning)."""
    global _TUNING
    saved = _TUNING
    _TUNING = dataclasses.replace(saved, **changes)
    try:
        yield _TUNING
    finally:
        _TUNING = saved


_FINALIZE_WARPS = 8
# NCHW (the slow path): the mask packs 8 channels a byte across threads that each hold a run
# of L; more channels a tile only make that shuffle bigger.
_NCHW_MAX_BLOCK_C = 8
# No reduction program with fewer rows than this: each writes 2*C partial sums, keep that
# under ~2% of what it reads.
_REDUCE_MIN_ROWS = 256
# Finalize: channels a program, partial rows a trip (P is at most one wave: a trip or two).
_FINALIZE_BLOCK_C, _FINALIZE_BLOCK_P = 16, 512
# Programs an SM holds when the CUDA occupancy query is unavailable.
_FALLBACK_PROGRAMS_PER_SM = 4
# The interpreter runs programs one after another: a few programs keep CI fast and still
# exercise the multi-program partial sums.
_INTERPRETER_PROGRAMS = 3


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """Smallest power of two >= n (plain Python: triton's helpers cost microseconds a call)."""
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=1)
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


_OCCUPANCY: dict[tuple[str, int], int] = {}


def _programs_per_sm(compiled) -> int:
    """Programs of a compiled kernel resident on one SM at once (CUDA occupancy API)."""
    key = (getattr(compiled, "hash", None) or str(id(compiled)), torch.cuda.current_device())
    if key not in _OCCUPANCY:
        count = ctypes.c_int(0)
        try:
            compiled._init_handles()  # loads the module: sets compiled.function
            threads = compiled.metadata.num_warps * getattr(compiled.metadata, "warp_size", 32)
            err = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(count), ctypes.c_void_p(compiled.function), ctypes.c_int(threads),
                ctypes.c_size_t(compiled.metadata.shared))
        except (OSError, AttributeError):
            err = -1
        _OCCUPANCY[key] = count.value if err == 0 and count.value > 0 else (
            _FALLBACK_PROGRAMS_PER_SM)
    return _OCCUPANCY[key]


_PROGRAMS: dict[tuple, int] = {}


def _reduction_programs(kernel, args: list, meta: dict, n_cb: int, n_rb: int,
                        block_l: int) -> int:
    """P, the programs per channel block of a grid-stride reduction: one wave of resident
    programs (no tail of late programs), none with fewer than _REDUCE_MIN_ROWS rows.
    `args` are the kernel's arguments with any value in place of the partial buffer and P."""
    most = max(n_rb // max(_REDUCE_MIN_ROWS // block_l, 1), 1)
    device = next(a for a in args if isinstance(a, torch.Tensor)).device
    if device.type != "cuda":
        return min(_INTERPRETER_PROGRAMS, most)
    key = (id(kernel), device, _TUNING.reduce_waves, tuple(sorted(meta.items())),
           *(str(a.dtype) if isinstance(a, torch.Tensor) else a for a in args))
    if key not in _PROGRAMS:  # a binder call saved on every later launch
        compiled = kernel.warmup(*args, grid=(1,), **meta)  # P is not specialised on
        wave = _TUNING.reduce_waves * _sm_count(device) * _programs_per_sm(compiled)
        _PROGRAMS[key] = max(min(wave // n_cb, most), 1)
    return _PROGRAMS[key]


@dataclass(frozen=True)
class _View:
    """A 4-D tensor as (O, L, C): channels_last -> (1, N*H*W, C), NCHW -> (N, H*W, C)."""

    channels_last: bool
    C: int
    L: int
    M: int  # N*H*W rows
    NB: int  # bytes of ReLU mask a row: ceil(C / 8)

    @staticmethod
    def of(x: torch.Tensor) -> _View:
        n, c, h, w = x.shape
        cl = _kernel_layout(x) == torch.channels_last
        return _View(cl, c, n * h * w if cl else h * w, n * h * w, _cdiv(c, 8))


def _kernel_layout(x: torch.Tensor) -> torch.memory_format:
    """channels_last when x is stored NHWC (and not also plainly contiguous), else NCHW."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def in_layout(t: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """t stored densely in `fmt` (a copy only when it is not already)."""
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


@dataclass(frozen=True)
class _Tiles:
    block_l: int
    block_c: int


@functools.lru_cache(maxsize=256)
def _tiles(view: _View, elem_bytes: int, tile_bytes: int, max_block_c: int) -> _Tiles:
    elems = max(tile_bytes // elem_bytes, 64)
    c_pow2 = max(_pow2(view.C), 8)  # >= 8: mask bits are packed 8 a byte
    if view.channels_last:
        block_c = min(c_pow2, max_block_c)
        block_l = max(elems // block_c, 1)
    else:  # L is contiguous: long runs along L; 8 channels (one mask byte) when L is long
        block_l = min(max(_pow2(view.L), 16), elems // 8)
        block_c = min(max(elems // block_l, 8), c_pow2, _NCHW_MAX_BLOCK_C)
    return _Tiles(block_l, block_c)


def _n_row_blocks(view: _View, block_l: int) -> int:
    outer = view.M // view.L if view.L else 0
    return outer * _cdiv(view.L, block_l)


def _reduce_tiles(view: _View, x: torch.Tensor) -> tuple[_Tiles, int, int]:
    """Tiles, row blocks and channel blocks of a reduction."""
    tiles = _tiles(view, x.element_size(), _TUNING.reduce_tile_bytes,
                   _TUNING.reduce_max_block_c)
    return tiles, _n_row_blocks(view, tiles.block_l), _cdiv(view.C, tiles.block_c)


def stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def batch_stats(x: torch.Tensor, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, momentum: float, eps: float):
    """Batch mean and 1/sqrt(var + eps) over N*H*W (fp32); blends the running stats in place."""
    view = _View.of(x)
    x = in_layout(x, _kernel_layout(x))
    tiles, n_rb, n_cb = _reduce_tiles(view, x)
    mean = torch.empty(view.C, dtype=stat_dtype(x), device=x.device)
    rstd = torch.empty_like(mean)
    meta = dict(BLOCK_L=tiles.block_l, BLOCK_C=tiles.block_c, CHANNELS_LAST=view.channels_last,
                num_warps=_TUNING.reduce_warps)
    args = [x, mean, view.C, view.L, n_rb, 1]
    P = _reduction_programs(_stats_kernel, args, meta, n_cb, n_rb, tiles.block_l)
    part = torch.empty((2 * P + 1, view.C), dtype=mean.dtype, device=x.device)
    _stats_kernel[(P * n_cb,)](x, part, view.C, view.L, n_rb, P, **meta)
    update = running_mean is not None
    _stats_finalize_kernel[(_cdiv(view.C, _FINALIZE_BLOCK_C),)](
        part, mean, rstd, running_mean if update else mean, running_var if update else rstd,
        view.C, P, view.M, eps, momentum, UPDATE=update,
        BLOCK_P=_FINALIZE_BLOCK_P, BLOCK_C=_FINALIZE_BLOCK_C, num_warps=_FINALIZE_WARPS)
    return mean, rstd


def _writable(out: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """`out` itself when the kernels can write it in `fmt`, else a buffer to copy back from."""
    return out if out.is_contiguous(memory_format=fmt) else torch.empty_like(
        out, memory_format=fmt)


def _apply_grid(view: _View, x: torch.Tensor) -> tuple[_Tiles, int, int]:
    tiles = _tiles(view, x.element_size(), _TUNING.apply_tile_bytes,
                   _TUNING.apply_max_block_c)
    n_rb = _n_row_blocks(view, tiles.block_l)
    return tiles, n_rb, n_rb * _cdiv(view.C, tiles.block_c)


def apply(x, mean, stat, weight, bias, residual, eps: float, stat_is_var: bool, relu: bool):
    """y = act((x - mean) * rstd * weight + bias + residual), and the ReLU mask bits."""
    view = _View.of(x)
    fmt = _kernel_layout(x)
    xk = in_layout(x, fmt)
    res = in_layout(residual, fmt) if residual is not None else None
    y = torch.empty_like(x)
    yk = _writable(y, fmt)
    bits = torch.empty((view.M, view.NB) if relu else (0,), dtype=torch.uint8, device=x.device)
    tiles, n_rb, n_programs = _apply_grid(view, xk)
    if n_programs:
        _apply_kernel[(n_programs,)](
            xk, res if res is not None else xk, yk, bits, mean, stat,
            weight if weight is not None else mean, bias if bias is not None else mean,
            view.C, view.L, view.NB, n_rb, eps,
            STAT_IS_VAR=stat_is_var, HAS_W=weight is not None, HAS_B=bias is not None,
            HAS_RES=res is not None, RELU=relu, BLOCK_L=tiles.block_l, BLOCK_C=tiles.block_c,
            CHANNELS_LAST=view.channels_last, num_warps=_TUNING.apply_warps)
    if yk is not y:
        y.copy_(yk)
    return y, bits


def backward(dy, x, weight, mean, stat, bits, eps: float, training: bool, relu: bool,
             res_grad: bool):
    """(dx, dweight, dbias, d_residual); dweight/dbias in the statistics dtype."""
    view = _View.of(x)
    fmt = _kernel_layout(x)
    xk, dyk = in_layout(x, fmt), in_layout(dy, fmt)
    dx = torch.empty_like(x)
    dres = torch.empty_like(x) if res_grad else x.new_empty((0,))
    dxk, dresk = _writable(dx, fmt), (_writable(dres, fmt) if res_grad else dres)
    tiles, n_rb, n_cb = _reduce_tiles(view, xk)
    w = weight if weight is not None else mean
    meta = dict(EVAL=not training, HAS_W=weight is not None, HAS_RES=res_grad, RELU=relu,
                BLOCK_L=tiles.block_l, BLOCK_C=tiles.block_c, CHANNELS_LAST=view.channels_last,
                num_warps=_TUNING.reduce_warps)
    args = [dyk, xk, bits, mean, stat, w, mean, dxk, dresk, view.C, view.L, view.NB, n_rb, 1, eps]
    P = _reduction_programs(_bwd_reduce_kernel, args, meta, n_cb, n_rb, tiles.block_l)
    part = torch.empty((2, P, view.C), dtype=mean.dtype, device=x.device)
    args[6], args[13] = part, P
    _bwd_reduce_kernel[(P * n_cb,)](*args, **meta)
    dw, db = torch.empty_like(mean), torch.empty_like(mean)
    _bwd_finalize_kernel[(_cdiv(view.C, _FINALIZE_BLOCK_C),)](
        part, mean, stat, dw, db, view.C, P, eps, STAT_IS_VAR=not training,
        BLOCK_P=_FINALIZE_BLOCK_P, BLOCK_C=_FINALIZE_BLOCK_C, num_warps=_FINALIZE_WARPS)
    if training:
        tiles, n_rb, n_programs = _apply_grid(view, xk)
        _bwd_apply_kernel[(n_programs,)](
            dyk, xk, bits, mean, stat, w, dw, db, dxk, dresk,
            view.C, view.L, view.NB, n_rb, view.M,
            HAS_W=weight is not None, HAS_RES=res_grad, RELU=relu,
            BLOCK_L=tiles.block_l, BLOCK_C=tiles.block_c,
            CHANNELS_LAST=view.channels_last, num_warps=_TUNING.apply_warps)
    for out, buf in ((dx, dxk), (dres, dresk)):
        if buf is not out:
            out.copy_(buf)
    return dx, dw, db, dres

