"""Launch plans of batch_norm_act: everything a call needs that follows from the inputs'
shapes, strides and dtypes and from the tuning, worked out once (see `_launch.py`).

A plan's methods take the call's tensors, allocate the outputs and launch; they never query
the device, compile, or derive a grid.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .._launch import Launch, aligned
from ._kernels import _apply_kernel, _stats_finalize_kernel, _stats_kernel
from ._runtime import counters, resident_programs
from ._tuning import ApplyConfig, BatchNormTuning, ReduceConfig

# NCHW (the slow path): the mask packs 8 channels a byte across threads that each hold a run
# of L; more channels a tile only make that shuffle bigger.
_NCHW_MAX_BLOCK_C = 8
# The separate finalize kernel: channels a program, partial rows a trip, warps.
_FINALIZE_BLOCK_C, _FINALIZE_BLOCK_P, _FINALIZE_WARPS = 16, 512, 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """Smallest power of two >= n (plain Python: triton's helpers cost microseconds a call)."""
    return 1 << max(n - 1, 0).bit_length()


def stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def kernel_layout(x: torch.Tensor) -> torch.memory_format:
    """channels_last when x is stored NHWC (and not also plainly contiguous), else NCHW."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def in_layout(t: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """t stored densely in `fmt` (a copy only when it is not already)."""
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


@dataclass(frozen=True)
class View:
    """A 4-D tensor as (O, L, C): channels_last -> (1, N*H*W, C), NCHW -> (N, H*W, C)."""

    channels_last: bool
    C: int
    L: int
    M: int  # N*H*W rows
    NB: int  # bytes of ReLU mask a row: ceil(C / 8)

    @staticmethod
    def of(x: torch.Tensor) -> View:
        n, c, h, w = x.shape
        cl = kernel_layout(x) == torch.channels_last
        return View(cl, c, n * h * w if cl else h * w, n * h * w, _cdiv(c, 8))


@dataclass(frozen=True)
class Tiles:
    block_l: int
    block_c: int
    n_rb: int  # row blocks
    n_cb: int  # channel blocks


@functools.lru_cache(maxsize=1024)
def tiles(view: View, elem_bytes: int, tile_bytes: int, max_block_c: int) -> Tiles:
    elems = max(tile_bytes // elem_bytes, 64)
    c_pow2 = max(_pow2(view.C), 8)  # >= 8: mask bits are packed 8 a byte
    if view.channels_last:
        block_c = min(c_pow2, max(_pow2(max_block_c), 8))
        block_l = max(elems // block_c, 1)
    else:  # L is contiguous: long runs along L; 8 channels (one mask byte) when L is long
        block_l = min(max(_pow2(view.L), 16), elems // 8)
        block_c = min(max(elems // block_l, 8), c_pow2, _NCHW_MAX_BLOCK_C)
    outer = view.M // view.L if view.L else 0
    return Tiles(block_l, block_c, outer * _cdiv(view.L, block_l), _cdiv(view.C, block_c))


class _Reduction:
    """Grid of a grid-stride reduction: P programs a channel block, cfg.waves waves of resident
    programs, none with fewer than cfg.min_rows rows; `fused`: the partial sums are few enough
    for the last program to add (else the plan launches a finalize kernel)."""

    def __init__(self, kernel, example_args: list, meta: dict, t: Tiles, cfg: ReduceConfig):
        most = max(t.n_rb // max(cfg.min_rows // t.block_l, 1), 1)
        meta = dict(
            meta,
            FUSED=True,
            BLOCK_P=max(2 * t.block_l, 2),
            BLOCK_L=t.block_l,
            BLOCK_C=t.block_c,
            num_warps=cfg.warps,
        )
        resident = resident_programs(kernel, example_args, meta)  # P is not specialised on
        self.P = max(min(cfg.waves * resident // t.n_cb, most), 1)
        self.fused = self.P * t.block_c <= cfg.fuse_max
        meta["FUSED"] = self.fused
        self.launch = Launch(kernel, self.P * t.n_cb, meta)


def _elementwise(
    kernel, example_args: list, meta: dict, t: Tiles, cfg: ApplyConfig, g_index: int
) -> tuple[Launch, int]:
    """(launch, G): G programs a channel block, from cfg.waves (0: one per row block)."""
    loop = cfg.waves > 0
    meta = dict(
        meta,
        LOOP=loop,
        PREFETCH=loop and cfg.prefetch,
        BLOCK_L=t.block_l,
        BLOCK_C=t.block_c,
        num_warps=cfg.warps,
    )
    g = t.n_rb
    if loop and t.n_rb > 0:
        resident = resident_programs(kernel, example_args, meta)  # G is not specialised on
        g = min(t.n_rb, max(cfg.waves * resident // t.n_cb, 1))
    example_args[g_index] = g
    return Launch(kernel, g * t.n_cb, meta), g


def _finalize_launch(kernel, c: int, **meta) -> Launch:
    meta = dict(
        meta, BLOCK_P=_FINALIZE_BLOCK_P, BLOCK_C=_FINALIZE_BLOCK_C, num_warps=_FINALIZE_WARPS
    )
    return Launch(kernel, _cdiv(c, _FINALIZE_BLOCK_C), meta)


class _Layout:
    """Input and output handling shared by both plans: the kernels read and write tensors
    dense in `fmt`; inputs with other strides are copied, outputs copied back."""

    def __init__(self, x: torch.Tensor, view: View):
        self.view = view
        self.fmt = kernel_layout(x)
        self.dense = x.is_contiguous(memory_format=self.fmt)
        self.strides = x.stride()
        self.device = x.device
        self.acc = stat_dtype(x)

    def kin(self, t: torch.Tensor) -> torch.Tensor:
        """t as the kernels read it."""
        if self.dense and t.stride() == self.strides:
            return t
        return in_layout(t, self.fmt)

    def out(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the output, what the kernels write: the output itself when it is dense in fmt)."""
        out = torch.empty_like(like)
        if self.dense or out.is_contiguous(memory_format=self.fmt):
            return out, out
        return out, torch.empty_like(out, memory_format=self.fmt)

    def example(self, dtype: torch.dtype | None = None, numel: int = 0) -> torch.Tensor:
        """A small placeholder of `dtype` (for compiling and sizing grids)."""
        return torch.empty(max(numel, self.view.C), dtype=dtype or self.acc, device=self.device)


class ForwardPlan(_Layout):
    """stats (training) and apply of one forward signature (`act`: a smooth activation's code,
    `_act_math.ACT_CODES`, or 0)."""

    def __init__(
        self,
        x,
        view: View,
        tuning: BatchNormTuning,
        weight,
        bias,
        running_mean,
        running_var,
        residual,
        training: bool,
        relu: bool,
        act: int = 0,
    ):
        super().__init__(x, view)
        self.relu, self.act = relu, act
        self.update = running_mean is not None
        if training:
            self._plan_stats(self.kin(x), tuning, running_mean, running_var)
        stat = running_var if not training else None
        self._plan_apply(x, tuning.apply, weight, bias, residual, stat)

    def _plan_stats(self, xk, tuning: BatchNormTuning, running_mean, running_var) -> None:
        v = self.view
        self.stats_tiles = t = tiles(
            v, xk.element_size(), tuning.stats.tile_bytes, tuning.stats.block_c
        )
        mean = self.example()
        rm, rv = (running_mean, running_var) if self.update else (mean, mean)
        example = [
            xk,
            mean,
            counters(xk, t.n_cb),
            mean,
            mean,
            rm,
            rv,
            v.C,
            v.L,
            t.n_rb,
            1,
            v.M,
            1e-5,
            0.1,
        ]
        self.reduction = r = _Reduction(
            _stats_kernel,
            example,
            dict(UPDATE=self.update, CHANNELS_LAST=v.channels_last),
            t,
            tuning.stats,
        )
        self.part_shape = (2 * r.P + 1, v.C)
        self.finalize = (
            None if r.fused else _finalize_launch(_stats_finalize_kernel, v.C, UPDATE=self.update)
        )

    def _plan_apply(self, x, cfg: ApplyConfig, weight, bias, residual, running_var) -> None:
        """running_var: the eval statistics (None in training: the batch rstd, fp32)."""
        v = self.view
        self.apply_tiles = t = tiles(v, x.element_size(), cfg.tile_bytes, cfg.block_c)
        meta = dict(
            STAT_IS_VAR=running_var is not None,
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            HAS_RES=residual is not None,
            RELU=self.relu,
            ACT=self.act,
            CHANNELS_LAST=v.channels_last,
        )
        xk, acc = self.kin(x), self.example()
        stat = acc if running_var is None else self.example(running_var.dtype)
        example = [
            xk,
            xk,
            xk,
            self.example(torch.uint8, v.NB * 16),
            acc,
            stat,
            acc if weight is None else weight,
            acc if bias is None else bias,
            v.C,
            v.L,
            v.NB,
            t.n_rb,
            1,
            1e-5,
        ]
        self.apply_launch, self.apply_g = _elementwise(_apply_kernel, example, meta, t, cfg, 12)

    def stats(self, x, running_mean, running_var, momentum: float, eps: float):
        """Batch mean and 1/sqrt(var + eps) (fp32); blends the running stats in place."""
        v, r = self.view, self.reduction
        part = torch.empty(self.part_shape, dtype=self.acc, device=self.device)
        mean = torch.empty(v.C, dtype=self.acc, device=self.device)
        rstd = torch.empty_like(mean)
        rm, rv = (running_mean, running_var) if self.update else (mean, rstd)
        ok = aligned(x, running_mean, running_var)
        r.launch(
            ok,
            self.kin(x),
            part,
            counters(x, self.stats_tiles.n_cb),
            mean,
            rstd,
            rm,
            rv,
            v.C,
            v.L,
            self.stats_tiles.n_rb,
            r.P,
            v.M,
            eps,
            momentum,
        )
        if self.finalize is not None:
            self.finalize(ok, part, mean, rstd, rm, rv, v.C, r.P, v.M, eps, momentum)
        return mean, rstd

    def apply(self, x, mean, stat, weight, bias, residual, eps: float):
        """y = act((x - mean) * rstd * weight + bias + residual), and the ReLU mask bits."""
        v, t = self.view, self.apply_tiles
        xk = self.kin(x)
        res = self.kin(residual) if residual is not None else xk
        y, yk = self.out(x)
        bits = torch.empty(
            (v.M, v.NB) if self.relu else (0,), dtype=torch.uint8, device=self.device
        )
        if t.n_rb:
            self.apply_launch(
                aligned(x, residual, weight, bias, mean, stat),
                xk,
                res,
                yk,
                bits,
                mean,
                stat,
                weight if weight is not None else mean,
                bias if bias is not None else mean,
                v.C,
                v.L,
                v.NB,
                t.n_rb,
                self.apply_g,
                eps,
            )
        if yk is not y:
            y.copy_(yk)
        return y, bits
