"""A LayerNorm backward's weight gradients: which of PyTorch's two kernels computes them, and
how long the slow one takes.

PyTorch's CUDA LayerNorm backward (aten/src/ATen/native/cuda/layer_norm_kernel.cu,
`LaunchGammaBetaBackwardCUDAKernel`) writes d_input row by row, then sums d_weight and d_bias
over the M rows in a second kernel that reads dy and x again (`flops/norm.py` counts that
re-read). Where it runs depends on M and N (the normalized length):
- split: M > 64 x 1024 and N / 32 < SMs / 2. Blocks of 32 columns x 32 rows cover the grid,
  then a .sum(0) adds their partial sums: the re-read streams like the rest of the op, at the
  norm family's measured rate (the norm@<N> workloads, 699050 rows of 192 and such, run it).
- columns: any other shape. One block of 32 x 32 threads per 32 columns walks all M rows, so
  ceil(N / 32) blocks run (N = 192: 6 of 132 SMs), each streaming its 32-column strip of dy
  and x at what one SM draws:
      time = waves x M x 32 columns x 2 tensors x itemsize / (copy rate / SMs x efficiency)
  with waves = ceil(ceil(N / 32) / SMs): independent of N up to 32 x SMs columns, and the
  efficiency of "norm_weight_grad" (an SM's share of the copy rate is 1; `gpushape probe`
  measures it, probe/workloads/).
On the H200 BERT's 25 LayerNorms over 16384 rows spent 2.07 ms a step in this kernel
(benchmarks/results/bench-h200/kernels-bert.json, GammaBetaBackwardCUDAKernelTemplate<...,
32u, 32u, 256u, false>), and LayerNorms over 50176 rows of 192 (ConvNeXt-T's and Swin-T's
second stage) took 0.32-0.34 ms a module where the rows alone price 0.13-0.15
(benchmarks/results/correlate-h200/correlate-lib.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import GPUSpec
from .families import WEIGHT_GRAD
from .flops.registry import packet
from .records import OpRecord

SPLIT_MIN_ROWS = 64 * 1024  # more rows than this (and few columns): the split path
COLUMNS_PER_BLOCK = 32
OPS = frozenset({"aten.native_layer_norm_backward"})


@dataclass(frozen=True, slots=True)
class WeightGradPass:
    """The weight-gradient kernel of one LayerNorm backward."""

    rows: int  # M: the rows summed over
    cols: int  # N: the normalized length, one gradient per column
    itemsize: int  # bytes per element of dy and x
    split: bool  # PyTorch's split path (all SMs), else one block per 32 columns

    @property
    def nbytes(self) -> int:
        """dy and x, read once more: what `flops/norm.py` counts as the op's re-read."""
        return 2 * self.rows * self.cols * self.itemsize


def weight_grad_pass(rec: OpRecord, sm_count: int) -> WeightGradPass | None:
    """The weight-gradient kernel `rec` runs on a GPU of `sm_count` SMs; None where it runs
    none (not a LayerNorm backward, or no weight or bias gradient asked)."""
    if packet(rec.op) not in OPS:
        return None
    mask = tuple(rec.params.get("output_mask", (True, True, True)))
    if not any(mask[1:]) or not rec.has_input("mean"):
        return None
    x = rec.input("input")
    rows = rec.input("mean").numel
    if rows <= 0 or x.numel == 0:
        return None
    cols = x.numel // rows
    split = rows > SPLIT_MIN_ROWS and cols // COLUMNS_PER_BLOCK < sm_count // 2
    return WeightGradPass(rows=rows, cols=cols, itemsize=x.itemsize, split=split)


def columns_time_s(grads: WeightGradPass, gpu: GPUSpec) -> float:
    """Seconds of the columns kernel (see the module docstring)."""
    sms = gpu.sm_count
    blocks = math.ceil(grads.cols / COLUMNS_PER_BLOCK)
    waves = math.ceil(blocks / sms)
    per_sm = gpu.attainable_bandwidth_bytes_per_s() / sms * gpu.achievable.memory(WEIGHT_GRAD)
    strip = grads.rows * COLUMNS_PER_BLOCK * 2 * grads.itemsize  # dy and x, one block's columns
    return waves * strip / per_sm


def weight_grad_cost(rec: OpRecord, gpu: GPUSpec) -> tuple[int, float]:
    """(bytes the columns kernel moves instead of the op's family, its seconds); (0, 0.0) where
    the op runs no columns kernel."""
    grads = weight_grad_pass(rec, gpu.sm_count)
    if grads is None or grads.split:
        return 0, 0.0
    return grads.nbytes, columns_time_s(grads, gpu)
