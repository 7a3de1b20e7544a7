"""What a tensor-core convolution loses in NCHW against channels_last, as an efficiency of the
bytes cuDNN's layout conversions move (the nchw-conv rule's model).

The nchw-conv rule prices an NCHW convolution's penalty as its NHWC conversions' bytes
(`trace.layout.nchw_conversion_bytes`) at the copy rate. The real NCHW path loses more than
that: the conversions run below the copy rate, and some kernels are slower. One training step of
two ResNet bottlenecks' convolutions (1x1, 3x3, 1x1; no norms, so the convolutions are all
there is) is timed in both layouts from CUDA graphs, alternated, and

    efficiency = (conversion bytes at the copy rate) / (NCHW step - channels_last step)

capped to [0.01, 1]. The profile keeps it as memory family "nchw_conversion"; the nchw-conv
rule divides its conversion time by it. Where NCHW is no slower, no efficiency is recorded and
the rule keeps the copy rate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..bench.timer import compare, cuda_graph
from ..hardware import GPUSpec
from .memory import FamilyWorkload, capped

# (outer channels, inner channels, spatial size) of each bottleneck: ResNet-50's first stage
# and its third, at batch 64
BLOCKS = ((256, 64, 56), (1024, 256, 14))
BATCH = 64


class _Bottlenecks(nn.Module):
    """Each block's 1x1 (c -> m), 3x3 (m -> m) and 1x1 (m -> c) convolutions, on its own input."""

    def __init__(self, blocks: tuple[tuple[int, int, int], ...]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(c, m, 1, bias=False),
                nn.Conv2d(m, m, 3, padding=1, bias=False),
                nn.Conv2d(m, c, 1, bias=False),
            )
            for c, m, _ in blocks
        )

    def forward(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return [stage(x) for stage, x in zip(self.stages, inputs)]


def _sizes(scale: float) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """Batch and blocks; a smoke test's scale (< 0.05) shrinks every dimension."""
    if scale >= 0.05:
        return max(int(BATCH * scale), 2), BLOCKS
    return 2, ((32, 16, 8), (64, 32, 4))


def conversion_bytes(
    blocks: tuple[tuple[int, int, int], ...], batch: int, element_size: int
) -> int:
    """The conversions' bytes in one training step of the blocks (input and weight gradients
    of every convolution: the blocks' inputs require grad)."""
    from ..tracing.layout import nchw_conversion_bytes

    total = 0
    for c, m, size in blocks:
        for cin, cout in ((c, m), (m, m), (m, c)):
            x, y = (batch * ch * size * size * element_size for ch in (cin, cout))
            total += nchw_conversion_bytes(x, y, grad_input=True, grad_weight=True)
    return total


def measure_nchw_conversion(
    work: FamilyWorkload,
    spec: GPUSpec,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    scale: float = 1.0,
    repeats: int = 20,
) -> dict[str, Any]:
    """The efficiency (see the module docstring) and what it came from."""
    batch, blocks = _sizes(scale)
    steps = {}
    for layout in (torch.contiguous_format, torch.channels_last):
        torch.manual_seed(0)  # one model per layout: the same weights, its own storage
        model = _Bottlenecks(blocks).to(device, dtype).to(memory_format=layout)
        inputs = [
            torch.randn(batch, c, s, s, device=device, dtype=dtype)
            .contiguous(memory_format=layout)
            .requires_grad_()
            for c, _, s in blocks
        ]
        params = [*model.parameters(), *inputs]

        def step(model=model, inputs=inputs, params=params) -> Any:
            outs = model(*inputs)
            return torch.autograd.grad(outs, params, [torch.ones_like(o) for o in outs])

        name = "nchw" if layout is torch.contiguous_format else "channels_last"
        step()  # cuDNN's algorithm choice, outside the capture
        steps[name] = cuda_graph(step) if torch.device(device).type == "cuda" else step
    on_gpu = torch.device(device).type == "cuda"
    times = compare(
        steps,
        rounds=4 if on_gpu else 2,
        repeats_per_round=max(repeats // 4, 2),
        warmup=2 if on_gpu else 1,
        device=device,
    )
    nchw_s, cl_s = times["nchw"].median_s, times["channels_last"].median_s
    nbytes = conversion_bytes(blocks, batch, torch.empty((), dtype=dtype).element_size())
    family_s = nbytes / spec.attainable_bandwidth_bytes_per_s()
    row = {
        "efficiency": capped(family_s, nchw_s - cl_s) if nchw_s > cl_s else None,
        "workload": work.describe,
        "dtype": str(dtype).removeprefix("torch."),
        "measured_s": nchw_s,
        "channels_last_s": cl_s,
        "conversion_bytes": nbytes,
        "family_roofline_s": family_s,
        "other_roofline_s": 0.0,
    }
    if nchw_s <= cl_s:
        row["note"] = "NCHW ran no slower than channels_last: the rule keeps the copy rate"
    if scale != 1.0:
        row["scale"] = scale
    return row
