"""The column sum of a row-major matrix, the bias gradient of a Linear (`grad.sum(0)`).

PyTorch reduces over the leading dimension of a (rows, n) bf16 matrix with a generic
reduction that reads it well below the copy rate. Here each program sums a band of rows for a
block of columns in fp32 and writes one partial row; the partial rows (a few dozen) are then
summed and cast to the input's dtype. The grid is sized to fill the GPU: columns blocks times
row bands of about four programs per SM.
"""

from __future__ import annotations

import torch

from .._dispatch import FLOAT_DTYPES, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA torch and in the dev extra
    triton = None

BLOCK_M = 32
BLOCK_N = 128
PROGRAMS_PER_SM = 4

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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bands(m: int, n: int, device: torch.device) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4
    col_blocks = _cdiv(n, BLOCK_N)
    row_blocks = _cdiv(m, BLOCK_M)
    return max(1, min(row_blocks, (PROGRAMS_PER_SM * sms) // col_blocks))


def column_sum(g: torch.Tensor) -> torch.Tensor:
    """`g.sum(0)` for a 2-D floating tensor, accumulated in fp32, returned in g's dtype."""
    if not isinstance(g, torch.Tensor) or g.dim() != 2:
        raise ValueError(f"column_sum needs a 2-D tensor, got {getattr(g, 'shape', type(g))}")
    if g.dtype not in FLOAT_DTYPES:
        raise TypeError(f"column_sum needs a floating tensor, got {g.dtype}")
    m, n = g.shape
    if triton is None or not use_triton(g) or m == 0 or n == 0 or g.dtype == torch.float64:
        return g.sum(0)
    if g.stride(1) != 1:
        g = g.contiguous()
    rows_per_band = _cdiv(_cdiv(m, _bands(m, n, g.device)), BLOCK_M) * BLOCK_M
    bands = _cdiv(m, rows_per_band)
    part = torch.empty(bands, n, device=g.device, dtype=torch.float32)
    grid = (_cdiv(n, BLOCK_N), bands)
    _column_sum_partial[grid](
        g, part, m, n, g.stride(0), rows_per_band, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N
    )
    return part.sum(0).to(g.dtype)
