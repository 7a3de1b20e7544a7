"""What graph-layers' GEMV bias gradients take off the GPU's work, where the profile measured
the GEMV.

Inside its graphs (and inside a whole-step graph captured around them) graph-layers takes each
16-bit Linear's bias gradient by a cuBLAS GEMV against a vector of ones instead of PyTorch's
reduction (transforms/_bias_grad.py): on the H200 16384 x 768 in 8.7 us against 25.2
(benchmarks/kernels/probe_bias_grad.py). The loop had priced such a stage's GPU work as the
eager step's, so graph-layers' GPU saving as none; measured, it was 0.4-1.2 ms a step on ViT-B/16,
Swin-T and ConvNeXt-T on an H100 (benchmarks/results/loops-h100-23). Each column sum the GEMV
takes (a Linear's, inside a captured layer, as `takes` chooses them) is priced again at the
profile's "gemv_column_sum@<rows>x<width>" figure nearest its shape (`fit_bias_grad.py` writes
them from the probe's GEMV timings); a profile without them keeps the reduction's price.
"""

from __future__ import annotations

from typing import Any

from ..tracing.sums import COLUMN_SUM, GEMV_SUM, grid_key, sum_shape
from ..transforms._bias_grad import MAX_OUT, MIN_ROWS

SIXTEEN_BIT = ("bfloat16", "float16")
# modules whose bias gradient comes from F.linear, which the GEMV mode reroutes: fuse-qkv's
# fused projection too (HF GPT-2's Conv1D runs addmm itself and keeps PyTorch's reduction)
LINEARS = ("Linear", "FusedLinear", "NonDynamicallyQuantizableLinear")


def inside(module: str, captured: list[str]) -> bool:
    """Whether `module` is one of the captured layers or inside one."""
    return any(module == c or module.startswith(c + ".") for c in captured)


def gemv_saving_s(traced: Any, costed: Any, gpu: Any, captured: list[str]) -> float:
    """GPU seconds the GEMV bias gradients of the captured layers' Linears save a step."""
    measured = gpu.achievable.memory_efficiency
    bandwidth = gpu.attainable_bandwidth_bytes_per_s()
    floor = gpu.achievable.kernel_floor_s
    by_index = {c.index: c for c in costed.ops}
    saving = 0.0
    for rec in traced.ops:
        if rec.module_type not in LINEARS or not rec.module or not inside(rec.module, captured):
            continue
        shape = sum_shape(rec)
        if shape is None or shape[0] != COLUMN_SUM or rec.index not in by_index:
            continue
        _, rows, width = shape
        x = rec.inputs[0]
        if rows < MIN_ROWS or width > MAX_OUT or x.dtype not in SIXTEEN_BIT:
            continue
        key = grid_key(GEMV_SUM, measured, rows, width)
        if key is None:
            continue
        gemv_s = max(x.nbytes / (bandwidth * measured[key]), floor)
        saving += max(by_index[rec.index].kernel_time_s - gemv_s, 0.0)
    return saving
