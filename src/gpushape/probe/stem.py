"""The rate of a convolution with 3 input channels (an RGB stem) against the GEMM model's.

cuDNN cannot feed tensor cores from 3 channels the way it does from 64: the H200 ran ResNet-50's
7x7 stride-2 stem about ten times slower than the model's tile and wave quantization predict.
One training step of that stem (forward and weight gradient, bf16, channels_last) is traced by
gpushape and timed from a CUDA graph;

    efficiency = (its GEMMs' time at the model's rate, no alignment penalty) / measured time

capped to [0.01, 1]. The profile keeps it under "conv_small_cin" and the GEMM model uses it as
the alignment penalty of any convolution with fewer input channels per group than the
tensor-core alignment (`Achievable.small_cin_conv`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..hardware import GPUSpec
from .memory import capped, step_s


def model_s(spec: GPUSpec, conv: nn.Conv2d, batch: int, size: int, dtype: torch.dtype) -> float:
    """The GEMM model's time for the stem's convolutions, without the alignment penalty."""
    from ..tracing.flops.registry import op_work
    from ..tracing.gemm_model import gemm_efficiency
    from ..tracing.inputs import TensorSpec
    from ..tracing.tracer import trace

    key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    total = 0.0
    example = TensorSpec((batch, conv.in_channels, size, size), dtype, channels_last=True)
    for rec in trace(conv, (example,), train=True).ops:
        for g in op_work(rec).gemms:
            e = gemm_efficiency(g, spec, key)
            total += g.flops / (spec.attainable_flops(key) * e.efficiency / e.alignment)
    return total


def measure_small_cin_conv(
    spec: GPUSpec,
    *,
    device: str = "cuda",
    batch: int = 64,
    size: int = 224,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 20,
) -> dict[str, Any]:
    """The stem's efficiency (see the module docstring) and what it came from."""
    spec = spec.replace(achievable=dataclasses.replace(spec.achievable, small_cin_conv=0.0))
    conv = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False).to(dtype)
    predicted = model_s(spec, conv, batch, size, dtype)
    conv = conv.to(device, memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device, dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )

    def step() -> Any:
        out = conv(x)
        return torch.autograd.grad(out, conv.weight, torch.ones_like(out))

    measured = step_s(step, device, repeats)
    return {
        "efficiency": capped(predicted, measured),
        "workload": f"Conv2d(3, 64, 7, stride 2) on {batch}x3x{size}x{size} channels_last, "
        "forward + weight gradient",
        "dtype": str(dtype).removeprefix("torch."),
        "measured_s": measured,
        "model_s": predicted,
    }
