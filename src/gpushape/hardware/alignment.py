"""`align(n, kind, gpu, dtype)`: the smallest size >= n a chip's tensor cores take at full speed.

The rule is the GPUSpec's: a GEMM dimension must be a multiple of `tc_alignment(dtype)` elements
(16 bytes in the catalog; what `gpushape probe` measured once a profile is applied, so a
calibrated spec carries the measured cliff). Kinds of dimension:
- "gemm": a matmul / Linear dimension, in the dtype the math runs in (fp32 as fp32: PyTorch's
  default `torch.backends.cuda.matmul.allow_tf32 = False`);
- "vocab": a vocabulary (an embedding tied to the LM head's GEMM): as "gemm";
- "conv": a convolution's channels; fp32 as TF32 (cuDNN's default `allow_tf32 = True`), as
  the cost model prices it (tracing/cost.py);
- "heads": an attention head size: a multiple of 8, which every fused SDPA kernel takes (flash
  pads other sizes itself, the memory-efficient kernel wants 16 bytes), and of the tensor-core
  alignment, so Q K^T's inner dimension is aligned too.
A dtype the chip has no tensor cores for has no granularity: the size stays as it is.

This module also holds the padding's size rule (`round_up`) the audit's tc-align rule prices,
so the size the audit predicts for is the size the pad-channels transform makes.

The chip: a GPUSpec as given (use a calibrated one for measured numbers), a catalog name
(datasheet numbers), or None: the CUDA GPU present when the catalog has it, else h100 (the same
default as the audit, `auditing/target.py`).
"""

from __future__ import annotations

import math
import operator
from typing import Any

from ..errors import GpushapeError
from .lookup import current_gpu, get_gpu
from .spec import GPUSpec, dtype_key

KINDS = ("gemm", "conv", "vocab", "heads")
DEFAULT_GPU = "h100"  # no GPU here (or one the catalog lacks): the audit's default chip
SDPA_HEAD_MULTIPLE = 8  # head sizes every fused SDPA kernel takes without padding


class AlignError(GpushapeError, ValueError):
    """A size, kind or dtype `align` cannot round."""


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n (`multiple` >= 1)."""
    return -(-n // multiple) * multiple


def target_gpu(gpu: GPUSpec | str | None = None) -> GPUSpec:
    """`gpu` as a GPUSpec; None: the CUDA GPU present when catalogued, else the default chip."""
    if gpu is not None:
        return get_gpu(gpu)
    try:
        present = current_gpu()
    except Exception:  # not in the catalog, or a broken driver: the default chip
        present = None
    return present or get_gpu(DEFAULT_GPU)


def _dtype(dtype: Any) -> str:
    try:
        return dtype_key(dtype)
    except ValueError as exc:
        raise AlignError(str(exc)) from None


def granularity(kind: str = "gemm", gpu: GPUSpec | str | None = None, dtype: Any = "bf16") -> int:
    """Elements a `kind` dimension must be a multiple of on `gpu` in `dtype` (1: no rule)."""
    if kind not in KINDS:
        raise AlignError(f"unknown dimension kind {kind!r}; use one of {', '.join(KINDS)}")
    key = _dtype(dtype)
    math_key = "tf32" if kind == "conv" and key == "fp32" else key
    elems = target_gpu(gpu).tc_alignment(math_key) or 1
    return math.lcm(SDPA_HEAD_MULTIPLE, elems) if kind == "heads" else elems


def align(n: int, kind: str = "gemm", gpu: GPUSpec | str | None = None, dtype: Any = "bf16") -> int:
    """The smallest size >= n the chip's tensor cores take at full speed for this kind of
    dimension (see the module docstring): align(50257) == 50264 in bf16."""
    try:
        size = operator.index(n)
    except TypeError:
        raise AlignError(f"align() needs a whole number of elements, got {n!r}") from None
    if size <= 0 or isinstance(n, bool):
        raise AlignError(f"align() needs a size of at least 1, got {n!r}")
    return round_up(size, granularity(kind, gpu, dtype))
