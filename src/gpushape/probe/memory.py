"""How fast eager PyTorch kernels of each memory family move their bytes, against the copy rate.

For each family of `tracing/families.py`, one training step of a workload that is mostly that
family (bf16, large enough to stream from memory) is traced by gpushape on the meta device and
timed on the GPU (a CUDA-graph replay: GPU time alone, what the cost model prices). With the
step's ops costed at the copy rate (efficiency 1),

    efficiency = (the family's ops' memory time) / (measured time - the other ops' time)

capped to [0.01, 1]. The profile keeps it under "memory_efficiency" and the cost model then
divides the family's memory time by it. Counting bytes with gpushape's own formulas keeps the
measurement and the prediction on one scale: the fraction absorbs whatever extra passes and
poor access patterns the eager kernels have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..bench.timer import cuda_graph, time_fn
from ..hardware import GPUSpec

_MIN_EFFICIENCY = 0.01


class _Workload(nn.Module):
    """A step over tensors it owns as parameters (so a training trace differentiates them)."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        *shapes: tuple[int, ...],
        channels_last: bool = False,
        modules: dict[str, nn.Module] | None = None,
    ):
        super().__init__()
        self.fn = fn
        self.inputs = nn.ParameterList()
        for shape in shapes:
            t = torch.randn(shape)
            if channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            self.inputs.append(nn.Parameter(t))
        self.layers = nn.ModuleDict(modules or {})

    def forward(self, _unused: torch.Tensor | None = None) -> torch.Tensor:
        return self.fn(self, *self.inputs)


@dataclass(frozen=True)
class FamilyWorkload:
    """`passes`: for gpushape's fused kernels (not traced: the meta trace would record their
    plain-PyTorch reference), the minimum bytes of the step as passes over its parameter.
    `measure`: a family measured its own way instead of `measure_family` (same arguments)."""

    family: str
    describe: str
    build: Callable[[float], nn.Module] | None
    passes: int = 0
    measure: Callable[..., dict[str, Any]] | None = None


def _fused(kind: str, scale: float) -> nn.Module:
    from ..kernels import BatchNormAct2d, LayerNormGELU, SoftmaxDropout

    if kind == "norm_act":
        return _Workload(
            lambda m, x: m.layers["op"](x),
            (_rows(scale, 32768), 4096),
            modules={"op": LayerNormGELU(4096)},
        )
    if kind == "batch_norm_act":  # a smoke test's scale shrinks every dimension
        c, hw = (256, 56) if scale >= 0.05 else (16, 8)
        shape = (max(int(64 * scale), 2), c, hw, hw)
        return _Workload(
            lambda m, x, r: m.layers["op"](x, r),
            shape,
            shape,
            channels_last=True,
            modules={"op": BatchNormAct2d(c)},
        )
    return _Workload(
        lambda m, x: m.layers["op"](x),
        (_rows(scale, 65536), 1024),
        modules={"op": SoftmaxDropout(0.1)},
    )


def _nchw_conversion(work: FamilyWorkload, spec: GPUSpec, **kwargs: Any) -> dict[str, Any]:
    from .layout import measure_nchw_conversion  # it imports this module

    return measure_nchw_conversion(work, spec, **kwargs)


def _rows(scale: float, full: int) -> int:
    return max(int(full * scale), 8)


def _embedding(scale: float) -> _Workload:
    ids = torch.randint(0, 30522, (_rows(scale, 32), 512))
    w = _Workload(lambda m, table: F.embedding(m.ids, table), (30522, 768))
    w.register_buffer("ids", ids)
    return w


def _layer_norm(scale: float, width: int) -> _Workload:
    """LayerNorm(width) over as many rows as make 32768 x 4096 elements."""
    return _Workload(
        lambda m, x: m.layers["ln"](x),
        (_rows(scale, 32768 * 4096 // width), width),
        modules={"ln": nn.LayerNorm(width)},
    )


WORKLOADS = (
    FamilyWorkload(
        "elementwise",
        "relu(x + y), x, y 8192x8192",
        lambda s: _Workload(
            lambda m, x, y: F.relu(x + y), (_rows(s, 8192), 8192), (_rows(s, 8192), 8192)
        ),
    ),
    FamilyWorkload(
        "activation",
        "gelu(x), x 8192x8192",
        lambda s: _Workload(lambda m, x: F.gelu(x), (_rows(s, 8192), 8192)),
    ),
    FamilyWorkload("norm", "LayerNorm(4096) on 32768x4096", lambda s: _layer_norm(s, 4096)),
    # the same bytes over shorter rows: BERT's and GPT-2's 768, ViT-S's 384 (families.ROW_BASE)
    FamilyWorkload("norm@768", "LayerNorm(768) on 174762x768", lambda s: _layer_norm(s, 768)),
    FamilyWorkload("norm@384", "LayerNorm(384) on 349525x384", lambda s: _layer_norm(s, 384)),
    FamilyWorkload(
        "batch_norm",
        "BatchNorm2d(256), training, 64x256x56x56 channels_last",
        lambda s: _Workload(
            lambda m, x: m.layers["bn"](x),
            (_rows(s, 64), 256, 56, 56),
            channels_last=True,
            modules={"bn": nn.BatchNorm2d(256)},
        ),
    ),
    FamilyWorkload(
        "batch_norm_nchw",
        "BatchNorm2d(256), training, 64x256x56x56 NCHW",
        lambda s: _Workload(
            lambda m, x: m.layers["bn"](x),
            (_rows(s, 64), 256, 56, 56),
            modules={"bn": nn.BatchNorm2d(256)},
        ),
    ),
    FamilyWorkload(
        "softmax",
        "softmax(dim=-1) on 65536x1024",
        lambda s: _Workload(lambda m, x: torch.softmax(x, -1), (_rows(s, 65536), 1024)),
    ),
    FamilyWorkload(
        "pool",
        "MaxPool2d(3, 2, 1) on 64x64x112x112 channels_last",
        lambda s: _Workload(
            lambda m, x: F.max_pool2d(x, 3, 2, 1), (_rows(s, 64), 64, 112, 112), channels_last=True
        ),
    ),
    FamilyWorkload(
        "pool_nchw",
        "MaxPool2d(3, 2, 1) on 64x64x112x112 NCHW",
        lambda s: _Workload(lambda m, x: F.max_pool2d(x, 3, 2, 1), (_rows(s, 64), 64, 112, 112)),
    ),
    FamilyWorkload("gather", "Embedding(30522, 768) over 32x512 token ids", _embedding),
    # a ConvNeXt stage's depthwise 7x7 (MobileNet's and EfficientNet's 3x3 and 5x5 run alike)
    FamilyWorkload(
        "grouped_conv",
        "depthwise Conv2d(384, 7x7, groups=384) on 64x384x28x28 channels_last",
        lambda s: _Workload(
            lambda m, x: m.layers["dw"](x),
            (_rows(s, 64), 384, 28, 28),
            channels_last=True,
            modules={"dw": nn.Conv2d(384, 384, 7, padding=3, groups=384, bias=False)},
        ),
    ),
    FamilyWorkload(
        "dropout",
        "dropout(p=0.1), training, 8192x8192",
        lambda s: _Workload(lambda m, x: F.dropout(x, 0.1, True), (_rows(s, 8192), 8192)),
    ),
    FamilyWorkload(
        "reduction",
        "sum over rows of 65536x1024 (a bias gradient's shape)",
        lambda s: _Workload(lambda m, x: x.sum(0), (_rows(s, 65536), 1024)),
    ),
    # fwd: read x, write y; bwd: read dy and x (or y), write dx
    FamilyWorkload(
        "fused_norm_act",
        "gpushape LayerNormGELU(4096) on 32768x4096",
        lambda s: _fused("norm_act", s),
        passes=5,
    ),
    # the bytes the audit keeps for a BatchNorm -> add -> ReLU chain once fused: the eager
    # chain's 16 passes (BatchNorm 3 + add 3 + ReLU 2 forward; ReLU 3 + BatchNorm 5 backward,
    # re-reads included) less the 8 the fusion removes; the kernel itself makes 10
    FamilyWorkload(
        "fused_batch_norm_act",
        "gpushape BatchNormAct2d(256) + residual, training, 64x256x56x56 channels_last",
        lambda s: _fused("batch_norm_act", s),
        passes=8,
    ),
    FamilyWorkload(
        "fused_softmax_dropout",
        "gpushape SoftmaxDropout(0.1) on 65536x1024",
        lambda s: _fused("softmax_dropout", s),
        passes=5,
    ),
    # not a kernel family: NCHW convolutions' loss against channels_last (probe/layout.py)
    FamilyWorkload(
        "nchw_conversion",
        "ResNet-50 bottleneck convolutions (stages 1 and 3, "
        "batch 64), training, NCHW against channels_last",
        None,
        measure=_nchw_conversion,
    ),
)


def _step(model: _Workload) -> Callable[[], Any]:
    params = list(model.parameters())

    def step() -> Any:
        out = model()
        return torch.autograd.grad(out, params, torch.ones_like(out))

    return step


def step_s(step: Callable[[], Any], device: str, repeats: int) -> float:
    """Median seconds of `step`: replayed from a CUDA graph on the GPU (GPU time alone, what
    the cost model prices), called directly on the CPU (a smoke test)."""
    if torch.device(device).type == "cuda":
        return time_fn(cuda_graph(step), warmup=3, repeats=repeats, device=device).median_s
    return time_fn(step, warmup=1, repeats=max(repeats // 4, 2), device=device).median_s


def capped(model_s: float, measured_s: float) -> float:
    """model_s / measured_s, rounded, within [0.01, 1] (0.01 where nothing was measured)."""
    ratio = model_s / measured_s if measured_s > 0 and model_s > 0 else _MIN_EFFICIENCY
    return round(min(max(ratio, _MIN_EFFICIENCY), 1.0), 4)


def measure_family(
    work: FamilyWorkload,
    spec: GPUSpec,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    scale: float = 1.0,
    repeats: int = 20,
) -> dict[str, Any]:
    """One family's efficiency (see the module docstring) and what it came from."""
    from ..tracing.cost import op_cost
    from ..tracing.families import memory_family
    from ..tracing.tracer import trace

    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    model = work.build(scale).to(dtype)
    family_s = other_s = 0.0
    if work.passes:
        big = next(iter(model.inputs))
        family_s = (
            work.passes * big.numel() * big.element_size() / flat.attainable_bandwidth_bytes_per_s()
        )
    else:
        for rec in trace(model, (), train=True).ops:
            c = op_cost(rec, flat)
            if memory_family(rec) == work.family.partition("@")[0]:  # "norm@768": norm
                family_s += c.memory_s
            else:
                other_s += c.kernel_time_s
    measured = step_s(_step(model.to(device)), device, repeats)
    row = {
        "efficiency": capped(family_s, measured - other_s),
        "workload": work.describe,
        "dtype": str(dtype).removeprefix("torch."),
        "measured_s": measured,
        "family_roofline_s": family_s,
        "other_roofline_s": other_s,
    }
    if scale != 1.0:
        row["scale"] = scale  # the workload's leading dimension, scaled: a smoke test
    return row


def measure_memory_efficiency(
    spec: GPUSpec,
    *,
    device: str = "cuda",
    scale: float = 1.0,
    families: tuple[str, ...] | None = None,
    on_family: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """{family: measure_family(...)} for every workload (or those of `families`); a family whose
    workload fails gets {"error": ...} instead (and keeps the copy rate)."""
    out = {}
    for work in WORKLOADS:
        if families is not None and work.family not in families:
            continue
        if on_family is not None:
            on_family(work.family)
        try:
            measure = work.measure or measure_family
            out[work.family] = measure(work, spec, device=device, scale=scale)
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # one family, reported
            out[work.family] = {
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "workload": work.describe,
            }
    return out
