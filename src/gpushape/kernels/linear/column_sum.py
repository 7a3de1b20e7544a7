"""The column sum of a row-major matrix, the bias gradient of a Linear (`grad.sum(0)`).

PyTorch reduces over the leading dimension of a (rows, n) bf16 matrix with a generic
reduction. Here each program sums a band of rows for a block of columns in fp32 and writes one
partial row; a second kernel sums the partial rows (a few dozen to a few hundred) and writes
the result in the input's dtype. The grid is sized to fill the GPU: column blocks times row
bands, about `programs_per_sm` programs per SM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._dispatch import FLOAT_DTYPES, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA torch and in the dev extra
    triton = None


@dataclass(frozen=True)
class ColumnSumTuning:
    block_m: int = 32
    block_n: int = 256
    programs_per_sm: int = 4
    num_warps: int = 4


TUNING = ColumnSumTuning()

if triton is not None:

    @triton.jit
    def _column_sum_partial(
        g_ptr,
        part_ptr,
        m,
        n,
        stride_m,
        rows_per_band,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        band = tl.program_id(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        start = band * rows_per_band
        stop = tl.minimum(start + rows_per_band, m)
        for r in range(start, stop, BLOCK_M):
            rows = r + tl.arange(0, BLOCK_M)
            mask = (rows[:, None] < stop) & col_ok[None, :]
            ptrs = g_ptr + rows[:, None].to(tl.int64) * stride_m + cols[None, :]
            acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(part_ptr + band * n + cols, tl.sum(acc, axis=0), mask=col_ok)

    @triton.jit
    def _column_sum_finish(
        part_ptr,
        out_ptr,
        bands,
        n,
        BF16: tl.constexpr,
        BLOCK_B: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n
        acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
        for b in range(0, bands, BLOCK_B):
            rows = b + tl.arange(0, BLOCK_B)
            mask = (rows[:, None] < bands) & col_ok[None, :]
            acc += tl.load(part_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
        total = tl.sum(acc, axis=0)
        if BF16:  # round to nearest even by hand: Triton's interpreter truncates
            bits = total.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            rounded = bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
            tl.store(out_ptr + cols, tl.where(total == total, rounded, total), mask=col_ok)
        else:
            tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_ok)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def column_sum(g: torch.Tensor, tuning: ColumnSumTuning | None = None) -> torch.Tensor:
    """`g.sum(0)` for a 2-D floating tensor, accumulated in fp32, returned in g's dtype."""
    if not isinstance(g, torch.Tensor) or g.dim() != 2:
        raise ValueError(f"column_sum needs a 2-D tensor, got {getattr(g, 'shape', type(g))}")
    if g.dtype not in FLOAT_DTYPES:
        raise TypeError(f"column_sum needs a floating tensor, got {g.dtype}")
    m, n = g.shape
    if triton is None or not use_triton(g) or m == 0 or n == 0 or g.dtype == torch.float64:
        return g.sum(0)
    t = tuning or TUNING
    if g.stride(1) != 1:
        g = g.contiguous()
    col_blocks = _cdiv(n, t.block_n)
    wanted = max(1, min(_cdiv(m, t.block_m), t.programs_per_sm * _sm_count(g.device) // col_blocks))
    rows_per_band = _cdiv(_cdiv(m, wanted), t.block_m) * t.block_m
    bands = _cdiv(m, rows_per_band)
    out = torch.empty(n, device=g.device, dtype=g.dtype)
    part = torch.empty(bands, n, device=g.device, dtype=torch.float32)
    _column_sum_partial[(col_blocks, bands)](
        g, part, m, n, g.stride(0), rows_per_band,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps,
    )  # fmt: skip
    _column_sum_finish[(_cdiv(n, 128),)](
        part, out, bands, n, BF16=g.dtype == torch.bfloat16, BLOCK_B=32, BLOCK_N=128
    )
    return out
