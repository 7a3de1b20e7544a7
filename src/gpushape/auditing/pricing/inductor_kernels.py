"""How many kernels a torch.compile'd training step launches, from the eager trace.

Inductor keeps the extern kernels (cuBLAS GEMMs, cuDNN convolutions, fused attention) as ATen
runs them and fuses everything between two of them: a run of pointwise ops becomes one Triton
kernel, a reduction gets a kernel of its own with its pointwise neighbours folded in. So the
count follows the extern kernels and the reductions, not the eager op count, which a model
written as many small ops (Hugging Face's RMSNorm and rotary embedding: about 20 eager kernels
a layer where Inductor runs 2-3) inflates.

Units counted, per phase (forward, backward), in trace order:
  - an extern op (`is_extern`: a GEMM, fused attention, any convolution, a depthwise one too,
    which the cost model prices memory-bound): its kernels as the cost model counts them, less
    cuDNN's NCHW <-> NHWC conversions where Inductor runs the convolutions channels_last itself;
  - a reduction: 1 kernel; 2 where Inductor splits it (a long reduction into a short output:
    a bias gradient, a statistic per channel), 3 for a training BatchNorm (split statistics,
    then the normalisation) and its backward, and for a LayerNorm backward (the input gradient
    a row at a time, the weight gradients split over the rows);
  - a run of ops between two extern ops with no reduction in it: 1 kernel.
Times `PER_UNIT`: on the H200 (torch 2.11), nine models' compiled steps launched 1.24-1.59
times as many kernels as these units (LLaMA-style, EfficientNet-B0, ViT-B/16, MobileNetV3,
Swin-T, GPT-2, ConvNeXt-T, ResNet-50, BERT; the kernels of `gpushape bench` runs under
benchmarks/results/bench-h200 and loops-h200-*, the rows of
`benchmarks/steps/fit_compile_host.py`): the copies and fills Inductor keeps, the optimizer's
step, which runs uncompiled. Counted with depthwise convolutions inside the runs, ConvNeXt-T's
had been 1.84. The eager op count had ranged 0.77-1.20 of them.
"""

from __future__ import annotations

import math
from typing import Any

from ...tracing.layout import conversion_passes

# measured kernels over units, median of the nine models in the module docstring (1.24-1.59)
PER_UNIT = 1.38
# reductions Inductor runs as three kernels (split statistics and the pointwise pass)
_THREE = {"native_batch_norm", "native_batch_norm_backward", "native_layer_norm_backward"}
_REDUCTIONS = _THREE | {
    "sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "std", "linalg_vector_norm",
    "native_layer_norm", "_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
    "embedding_dense_backward", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
    "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "cumsum", "argmax", "argmin", "topk", "sort",
    "_fused_rms_norm", "_fused_rms_norm_backward",
}  # fmt: skip
# a reduction into at most this many outputs from at least SPLIT_INPUT elements is split
SPLIT_OUTPUT = 1 << 16
SPLIT_INPUT = 1 << 20


# ops Inductor leaves to ATen's kernels whatever their FLOPs: a depthwise or grouped
# convolution is a cuDNN kernel (priced memory-bound, no GEMM FLOPs), not generated code
EXTERN_OPS = frozenset({"convolution", "convolution_backward", "_convolution"})


def is_extern(rec: Any, op: Any) -> bool:
    """Whether Inductor runs this traced op as an extern kernel (a GEMM, a convolution, fused
    attention) rather than fusing it into generated code."""
    return (op is not None and op.gemm_flops > 0) or _base(rec.name) in EXTERN_OPS


def _base(name: str) -> str:
    """A record's op name without its overload ("native_batch_norm.default" -> ...)."""
    return name.split(".", 1)[0]


def _reduction_kernels(rec: Any) -> int:
    name = _base(rec.name)
    if name in _THREE:
        return 3
    if name in ("sum", "mean") and rec.inputs and rec.outputs and rec.outputs[0] is not None:
        out = math.prod(rec.outputs[0].shape)
        return 2 if out <= SPLIT_OUTPUT and math.prod(rec.inputs[0].shape) >= SPLIT_INPUT else 1
    return 1


def compiled_units(trace: Any, cost: Any, channels_last_convs: bool) -> int:
    """The units of the module docstring over the trace's forward and backward."""
    by_index = {c.index: c for c in cost.ops}
    units = 0
    for phase in ("forward", "backward"):
        run_open = run_reduces = False
        for rec in trace.ops:
            if rec.phase != phase or rec.kind != "compute":
                continue
            op = by_index.get(rec.index)
            if is_extern(rec, op):  # an extern kernel: closes the run
                tensor_cores = op is not None and op.tensor_cores
                conversions = 2 * conversion_passes(rec) if tensor_cores else 0
                kernels = op.kernels if op is not None else 1
                units += max(kernels - (conversions if channels_last_convs else 0), 1)
                units += run_open and not run_reduces
                run_open = run_reduces = False
                continue
            run_open = True
            if _base(rec.name) in _REDUCTIONS:
                units += _reduction_kernels(rec)
                run_reduces = True
        units += run_open and not run_reduces
    return units


def compiled_kernels_of(trace: Any, cost: Any, channels_last_convs: bool) -> int:
    """The kernels a compiled training step launches (module docstring)."""
    return round(PER_UNIT * compiled_units(trace, cost, channels_last_convs))
