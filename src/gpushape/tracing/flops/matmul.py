"""Matrix products: mm, addmm, bmm, baddbmm, matmul, linear, _scaled_mm; mv, dot.

C[M, N] = A[M, K] @ B[K, N] is 2*M*N*K FLOPs (FLOPs = 2 x MACs). An added input (addmm's bias,
baddbmm's `self`) adds one FLOP per output element. Matrix-vector products (mv, dot) run on
CUDA cores and are memory-bound: they carry no `Gemm`.

Alignment: cuBLAS takes the tensor-core fast path when each operand's leading dimension (the
stride of its non-contiguous dimension) is a multiple of 16 bytes; these are the `align_dims`.
A row-major A[M, K] has leading dimension K; a transposed view has M.
"""

from __future__ import annotations

import math

from ..records import OpRecord, TensorMeta
from .registry import Gemm, OpWork, io_bytes, register_formula


def leading_dim(t: TensorMeta, row: str, col: str) -> tuple[str, int] | None:
    """(name, elements) of the leading dimension of the matrix in t's last two dims."""
    if len(t.shape) < 2:
        return None
    rows, cols = t.shape[-2], t.shape[-1]
    row_stride, col_stride = t.strides[-2], t.strides[-1]
    if col_stride == 1 or cols == 1:  # row-major: rows are `row_stride` apart
        ld, dim, size = row_stride, col, cols
    elif row_stride == 1 or rows == 1:  # column-major (a transposed view)
        ld, dim, size = col_stride, row, rows
    else:  # neither: PyTorch copies it to row-major first
        ld, dim, size = cols, col, cols
    if rows == 1 and cols == 1:
        return None
    return (dim if ld == size else f"ld({dim})", ld)


def _align(*pairs: tuple[str, int] | None) -> tuple[tuple[str, int], ...]:
    seen: dict[str, int] = {}
    for pair in pairs:
        if pair is not None and pair[0] not in seen:
            seen[pair[0]] = pair[1]
    return tuple(seen.items())


def _mm(rec: OpRecord, a: str, b: str, bias: str | None = None) -> OpWork:
    A, B = rec.input(a), rec.input(b)
    m, k = A.shape[-2], A.shape[-1]
    n = B.shape[-1]
    batch = math.prod(A.shape[:-2]) if len(A.shape) > 2 else 1
    flops = 2 * batch * m * n * k
    out = rec.outputs[0]
    align = _align(leading_dim(A, "M", "K"), leading_dim(B, "K", "N"), leading_dim(out, "M", "N"))
    gemm = Gemm(m=m, n=n, k=k, batch=batch, flops=flops, family="gemm", align_dims=align)
    extra = out.numel if bias is not None and rec.has_input(bias) else 0
    return OpWork(flops=flops + extra, min_bytes=io_bytes(rec), gemms=(gemm,))


@register_formula("aten.mm", "aten._scaled_mm")
def mm(rec: OpRecord) -> OpWork:
    names = rec.input_names
    return _mm(rec, names[0], names[1])


@register_formula("aten.addmm")
def addmm(rec: OpRecord) -> OpWork:
    """bias[N] + A[M, K] @ B[K, N]: 2MNK + MN."""
    return _mm(rec, "mat1", "mat2", bias="self")


@register_formula("aten.bmm")
def bmm(rec: OpRecord) -> OpWork:
    """A[b, M, K] @ B[b, K, N]: 2bMNK."""
    return _mm(rec, "self", "mat2")


@register_formula("aten.baddbmm")
def baddbmm(rec: OpRecord) -> OpWork:
    """self[b, M, N] + A[b, M, K] @ B[b, K, N]: 2bMNK + bMN."""
    return _mm(rec, "batch1", "batch2", bias="self")


@register_formula("aten.matmul", "aten.linear")
def matmul(rec: OpRecord) -> OpWork:
    """Broadcasting products: 2 x (output elements) x K, seen as one GEMM with M = out / N.
    (These are decomposed before the dispatcher in eager PyTorch; registered for traces
    where they arrive whole.)"""
    A, B = rec.inputs[0], rec.inputs[1]
    out = rec.outputs[0]
    k = A.shape[-1]
    linear = rec.op.startswith("aten.linear")
    n = B.shape[0] if linear else (B.shape[-1] if len(B.shape) > 1 else 1)
    m = max(out.numel // max(n, 1), 1)
    flops = 2 * out.numel * k
    extra = out.numel if linear and rec.has_input("bias") else 0
    gemm = Gemm(
        m=m,
        n=n,
        k=k,
        flops=flops,
        family="gemm",
        align_dims=_align(leading_dim(A, "M", "K"), leading_dim(B, "K", "N")),
    )
    return OpWork(flops=flops + extra, min_bytes=io_bytes(rec), gemms=(gemm,))


@register_formula("aten.mv", "aten.addmv")
def mv(rec: OpRecord) -> OpWork:
    """A[M, K] @ x[K]: 2MK (+ M for addmv's added vector). Memory-bound: no tensor cores."""
    A = rec.input("mat")
    m, k = A.shape
    extra = m if rec.op.startswith("aten.addmv") else 0
    return OpWork(flops=2 * m * k + extra, min_bytes=io_bytes(rec))


@register_formula("aten.dot", "aten.vdot")
def dot(rec: OpRecord) -> OpWork:
    """x[K] . y[K]: 2K."""
    return OpWork(flops=2 * rec.inputs[0].numel, min_bytes=io_bytes(rec))
