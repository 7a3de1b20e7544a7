"""Convolutions measured against gpushape's own model: what the cost model cannot derive.

1. The rate of a convolution with 3 input channels (an RGB stem) against the GEMM model's.
   cuDNN cannot feed tensor cores from 3 channels the way it does from 64: the H200 ran
   ResNet-50's 7x7 stride-2 stem about ten times slower than the model's tile and wave
   quantization predict. One training step of that stem (forward and weight gradient, bf16,
   channels_last) is traced by gpushape and timed from a CUDA graph;

       efficiency = (its GEMMs' time at the model's rate, no alignment penalty) / measured time

   capped to [0.01, 1]. The profile keeps it under "conv_small_cin" and the GEMM model uses it
   as the alignment penalty of any convolution with fewer input channels per group than the
   tensor-core alignment (`Achievable.small_cin_conv`).
   A patch embedding (stride equal to the kernel: ViT's 16x16/16, ConvNeXt's 4x4/4) on 3
   channels runs other kernels: the H200 ran ViT-B/16's at about half the stem's rate and
   ConvNeXt's at a quarter (benchmarks/results/correlate-h200/correlate-lib.json).
   Measured the same way, beside the memory families (probe/workloads/, tracing/gemm_model.py
   `small_cin_rate`): by `measure_stem_conv`, each patch side ("patch_conv@<side>") and a stem
   at another stride (PoolFormer's 7x7/4, "small_cin_conv@<stride>"); by
   `measure_downsample_conv`, ConvNeXt's 2x2/2 downsampling on aligned channels, forward and
   both gradients ("downsample_conv@<side>"); by `measure_s2d_stem`, s2d-stem's convolution
   over the stem's input folded into 16 channels at stride 1 ("s2d_stem").

2. What a tensor-core convolution loses in NCHW against channels_last, as an efficiency of the
   bytes cuDNN's layout conversions move (the nchw-conv rule's model). The rule prices an NCHW
   convolution's penalty as its NHWC conversions' bytes (`trace.layout.nchw_conversion_bytes`)
   at the copy rate. The real NCHW path loses more than that: the conversions run below the
   copy rate, and some kernels are slower. One training step of two ResNet bottlenecks'
   convolutions (1x1, 3x3, 1x1; no norms, so the convolutions are all there is) is timed in
   both layouts from CUDA graphs, alternated, and

       efficiency = (conversion bytes at the copy rate) / (NCHW step - channels_last step)

   capped to [0.01, 1]. The profile keeps it as memory family "nchw_conversion"; the nchw-conv
   rule divides its conversion time by it. Where NCHW is no slower, no efficiency is recorded
   and the rule keeps the copy rate. A patch embedding's or a stem's conversions (a 3-channel
   image into NHWC) run at rates of their own: `measure_stem_conv` times each in both layouts,
   and the difference gives "nchw_conversion@<side>" (a patch side) or "nchw_conversion_stem"
   ("@<stride>" at strides other than 2) the same way (`conversion_row`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..bench.timer import compare, cuda_graph
from ..hardware import GPUSpec
from ..tracing.layout import STEM_CONVERSION, STEM_STRIDE, nchw_conversion_bytes
from .memory import capped, step_s
from .workloads import FamilyWorkload

CONVERSION = "nchw_conversion"  # tracing/layout.py's key, "@<side>" for a patch embedding


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
    conv = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    row = conv_rate(spec, conv, batch, size, device=device, dtype=dtype, repeats=repeats)
    return {
        **row,
        "workload": f"Conv2d(3, 64, 7, stride 2) on {batch}x3x{size}x{size} channels_last, "
        "forward + weight gradient",
    }


def measure_stem_conv(
    work: Any, spec: GPUSpec, *, device: str = "cuda", scale: float = 1.0, repeats: int = 20
) -> dict[str, Any]:
    """A convolution on an image's few channels (`work.build` gives it; probe/workloads/): a
    stem at a stride other than 2 (PoolFormer's 7x7/4) or a patch embedding (ViT's 16x16/16),
    measured as the stride-2 stem is (`measure_small_cin_conv`: channels_last, forward and
    weight gradient, against the GEMM model's rate), with its NCHW step timed beside it: the
    cost model prices NCHW as channels_last plus conversions, whose own rate the difference
    gives (`conversion_row`, kept as a row of its own under `conversion_key`)."""
    batch, size = _size(scale)
    row = conv_rate(spec, work.build(scale), batch, size, device=device, repeats=repeats)
    row["workload"] = work.describe
    row["family_roofline_s"] = row["model_s"]  # as the memory families' rows name it
    row["nchw_measured_s"] = conv_rate(
        spec, work.build(scale), batch, size, device=device, repeats=repeats, channels_last=False
    )["measured_s"]
    if scale != 1.0:
        row["scale"] = scale
    conv = work.build(scale)
    conversion = conversion_row(row, conv, batch, size, spec)
    if conversion is not None:  # measure_memory_efficiency keeps it as a row of its own
        if scale != 1.0:
            conversion["scale"] = scale
        row["derived"] = {conversion_key(conv): conversion}
    return row


def measure_stem_conversion(
    work: Any, spec: GPUSpec, *, device: str = "cuda", scale: float = 1.0, repeats: int = 20
) -> dict[str, Any]:
    """The stride-2 stem's NCHW conversions (`STEM_CONVERSION`): `measure_stem_conv`'s two
    timings of it as `conversion_row`; where NCHW ran no slower, the copy rate (efficiency 1)."""
    row = measure_stem_conv(work, spec, device=device, scale=scale, repeats=repeats)
    conv = work.build(scale)
    made = row.pop("derived", {}).get(conversion_key(conv))
    if made is None:
        made = {**row, "efficiency": 1.0, "note": "NCHW ran no slower than channels_last"}
    return made


def _size(scale: float) -> tuple[int, int]:
    """(batch, image side) of a stem's or patch embedding's workload at `scale`."""
    return (64, 224) if scale >= 0.05 else (2, 32)


def conversion_key(conv: nn.Conv2d) -> str:
    """The profile key of `conv`'s NCHW conversions (tracing/layout.py `conversion_family`): a
    patch embedding's "nchw_conversion@<side>", a stem's STEM_CONVERSION ("@<stride>")."""
    side, stride = conv.kernel_size[0], conv.stride[0]
    if side == stride and not any(conv.padding):
        return f"{CONVERSION}@{side}"
    return STEM_CONVERSION if stride == STEM_STRIDE else f"{STEM_CONVERSION}@{stride}"


def conversion_row(
    row: dict[str, Any], conv: nn.Conv2d, batch: int, size: int, spec: GPUSpec
) -> dict[str, Any] | None:
    """What a convolution on an image's few channels loses in NCHW, from `measure_stem_conv`'s
    two timings of it (forward and weight gradient), as an efficiency of its conversions' bytes
    (in and out, read and written, both passes), as "nchw_conversion" is for bottlenecks. None
    where NCHW ran no slower."""
    extra_s = row["nchw_measured_s"] - row["measured_s"]
    if extra_s <= 0:
        return None
    k, s, p = conv.kernel_size[0], conv.stride[0], conv.padding[0]
    side, itemsize = (size + 2 * p - k) // s + 1, 2  # timed in bf16
    x = batch * conv.in_channels * size * size * itemsize
    y = batch * conv.out_channels * side * side * itemsize
    nbytes = nchw_conversion_bytes(x, y, grad_input=False, grad_weight=True)
    family_s = nbytes / spec.attainable_bandwidth_bytes_per_s()
    return {
        "efficiency": capped(family_s, extra_s),
        "workload": row["workload"].replace(" channels_last,", ",")
        + ", NCHW against channels_last",
        "dtype": "bfloat16",
        "measured_s": row["nchw_measured_s"],
        "channels_last_s": row["measured_s"],
        "conversion_bytes": nbytes,
        "family_roofline_s": family_s,
        "other_roofline_s": 0.0,
    }


def s2d_stem_workload(
    work: Any, scale: float = 1.0
) -> tuple[nn.Module, nn.Module, nn.Conv2d, int, int, int]:
    """(stem, its SpaceToDepthConv2d, the stride-1 convolution that module runs, batch, the
    input's side, the folded input's side) for the stem `work.build` gives, as
    `measure_s2d_stem` times them."""
    from ..models.space_to_depth import SpaceToDepthConv2d

    batch, size = (64, 224) if scale >= 0.05 else (2, 32)
    stem = work.build(scale)
    module = SpaceToDepthConv2d(stem)
    kh, s, p = module.kernel_size[0], module.stride, module.padding[0]
    side = -(-kh // s)
    folded = (size + 2 * p - kh) // s + side  # the folded input's side: outputs + side - 1
    conv = nn.Conv2d(
        module.channels, stem.out_channels, side, bias=False, device=stem.weight.device
    )
    return stem, module, conv, batch, size, folded


def rate_model_s(
    spec: GPUSpec, conv: nn.Conv2d, batch: int, size: int, dtype: torch.dtype = torch.bfloat16
) -> float:
    """The time `conv_rate` divides by the measured one: the GEMM model's, no alignment
    penalty and no measured rates applied."""
    spec = spec.replace(
        achievable=dataclasses.replace(spec.achievable, small_cin_conv=0.0, memory_efficiency={})
    )
    return model_s(spec, conv.to(dtype), batch, size, dtype)


def measure_s2d_stem(
    work: Any, spec: GPUSpec, *, device: str = "cuda", scale: float = 1.0, repeats: int = 20
) -> dict[str, Any]:
    """The convolution s2d-stem's SpaceToDepthConv2d runs for the stem `work.build` gives (a
    stride-1 convolution on the folded, aligned channels) the way the stem is measured: its
    forward and weight gradient against the GEMM model's time for them; kept as "s2d_stem"
    (tracing/flops/conv.py `rate_key`). The folds are not in it: the cost model prices their
    copies as it does any copy. The module's whole step and the plain stem's are timed beside
    it, for reference."""
    stem, module, conv, batch, size, folded = s2d_stem_workload(work, scale)
    row = conv_rate(spec, conv, batch, folded, device=device, repeats=repeats)
    row["module_measured_s"] = conv_rate(spec, module, batch, size, device=device, repeats=repeats)[
        "measured_s"
    ]
    row["stem_measured_s"] = conv_rate(spec, stem, batch, size, device=device, repeats=repeats)[
        "measured_s"
    ]
    row["workload"] = work.describe
    row["family_roofline_s"] = row["model_s"]  # as the memory families' rows name it
    if scale != 1.0:
        row["scale"] = scale
    return row


def measure_downsample_conv(
    work: Any, spec: GPUSpec, *, device: str = "cuda", scale: float = 1.0, repeats: int = 20
) -> dict[str, Any]:
    """A patch convolution on aligned channels (`work.build`: the convolution on its input, a
    parameter, so both gradients run), timed against the GEMM model's time for its GEMMs; kept
    as "downsample_conv@<side>" (tracing/gemm_model.py `downsample_rate`)."""
    from ..tracing.flops.registry import op_work
    from ..tracing.gemm_model import gemm_efficiency
    from ..tracing.tracer import trace
    from .memory import _step

    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    model = work.build(scale).to(torch.bfloat16)
    predicted = sum(
        g.flops / (flat.attainable_flops("bf16") * gemm_efficiency(g, flat, "bf16").efficiency)
        for rec in trace(model, (), train=True).ops
        for g in op_work(rec).gemms
    )
    measured = step_s(_step(model.to(device)), device, repeats)
    row = {
        "efficiency": capped(predicted, measured),
        "workload": work.describe,
        "dtype": "bfloat16",
        "measured_s": measured,
        "model_s": predicted,
        "family_roofline_s": predicted,  # as the memory families' rows name it
    }
    if scale != 1.0:
        row["scale"] = scale
    return row


def conv_rate(
    spec: GPUSpec,
    conv: nn.Conv2d,
    batch: int,
    size: int,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 20,
    channels_last: bool = True,
) -> dict[str, Any]:
    """One training step of `conv` (forward and weight gradient, the input needs none) timed
    against the GEMM model's time without its alignment penalty."""
    conv = conv.to(dtype)
    predicted = rate_model_s(spec, conv, batch, size, dtype)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    conv = conv.to(device, memory_format=layout)
    x = torch.randn(batch, conv.in_channels, size, size, device=device, dtype=dtype)
    x = x.contiguous(memory_format=layout)
    params = [p for p in conv.parameters() if p.requires_grad]

    def step() -> Any:
        out = conv(x)
        return torch.autograd.grad(out, params, torch.ones_like(out))

    measured = step_s(step, device, repeats)
    return {
        "efficiency": capped(predicted, measured),
        "dtype": str(dtype).removeprefix("torch."),
        "measured_s": measured,
        "model_s": predicted,
    }


# ---- NCHW against channels_last ------------------------------------------------------------
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
