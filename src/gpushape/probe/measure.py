"""The probe's single measurements: one GEMM, one convolution, a copy, a kernel launch.

Each returns seconds per call (median of `repeats` timed samples by `time_fn`, CUDA events on a
GPU). A sample runs the op back to back enough times to last about `target_s`, so launch latency
does not inflate short kernels, and cycles through several random input sets when one set would
sit in L2 (a cached operand flatters a memory-bound op). Everything runs on the CPU too, with tiny
sizes, which is how the CPU tests smoke-test the probe.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..bench.record import copy_bandwidth_bytes_per_s
from ..bench.timer import time_fn

# The dtype keys the probe measures GEMMs in. "fp32" runs with TF32 off (CUDA cores), "tf32" is
# fp32 storage with TF32 tensor-core math on, "fp8" is e4m3 through torch._scaled_mm.
GEMM_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
_STORAGE = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    device: str = "cuda"
    repeats: int = 7  # timed samples per point; the median is kept
    target_s: float = 1e-3  # each sample repeats the op until it lasts about this long
    max_inner: int = 256  # ... but never more than this many calls per sample
    l2_bytes: int = 0  # rotate input sets when an op's operands fit in L2; 0: never
    max_input_sets: int = 8


def storage_dtype(key: str) -> torch.dtype:
    if key == "fp8":
        return torch.float8_e4m3fn
    return _STORAGE[key]


def input_sets_for(working_set_bytes: int, cfg: MeasureConfig) -> int:
    """How many distinct input sets make the rotation at least twice the L2 size."""
    if cfg.l2_bytes <= 0 or working_set_bytes >= cfg.l2_bytes:
        return 1
    return min(cfg.max_input_sets, math.ceil(2 * cfg.l2_bytes / max(working_set_bytes, 1)))


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def per_call_s(
    op: Callable[..., Any], input_sets: Sequence[Sequence[Any]], cfg: MeasureConfig
) -> float:
    """Median seconds per call of `op(*inputs)`, rotating over `input_sets`."""
    rotation: Iterator[Sequence[Any]] = itertools.cycle(input_sets)
    op(*next(rotation))  # first call: library heuristics, autotuning, lazy init
    _sync(cfg.device)
    # the fastest of three single calls sizes the samples (a first call can be slow)
    one = time_fn(lambda: op(*next(rotation)), warmup=1, repeats=3, device=cfg.device).min_s
    inner = max(1, min(cfg.max_inner, round(cfg.target_s / max(one, 1e-9))))

    def sample() -> None:
        for _ in range(inner):
            op(*next(rotation))

    timing = time_fn(sample, warmup=1, repeats=cfg.repeats, device=cfg.device)
    return timing.median_s / inner


@contextmanager
def math_mode(dtype: str, *, cudnn_benchmark: bool | None = None) -> Iterator[None]:
    """TF32 on for "tf32" and off for everything else (matmul and cuDNN), restored after."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
    matmul.allow_tf32 = cudnn.allow_tf32 = dtype == "tf32"
    if cudnn_benchmark is not None:
        cudnn.benchmark = cudnn_benchmark
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = saved


# ---- GEMM --------------------------------------------------------------------------------------
def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def _gemm_operands(m: int, n: int, k: int, dtype: str, layout: str, device: str):
    """(a, b, op): a (m, k) row-major; b (k, n) row-major for "nn", (n, k) for "nt" (F.linear)."""
    if dtype == "fp8":  # _scaled_mm wants b column-major: the "nt" layout of a Linear weight
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        return a, w, lambda a, w: torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16)
    dt = storage_dtype(dtype)
    a = torch.randn(m, k, device=device, dtype=dt)
    if layout == "nn":
        return a, torch.randn(k, n, device=device, dtype=dt), torch.matmul
    if layout == "nt":
        return a, torch.randn(n, k, device=device, dtype=dt), F.linear
    raise ValueError(f"unknown GEMM layout {layout!r}; known: nn, nt")


def gemm_s(m: int, n: int, k: int, dtype: str, cfg: MeasureConfig, *, layout: str = "nn") -> float:
    """Seconds per (m x k) @ (k x n) GEMM in `dtype` ("fp32", "tf32", "fp16", "bf16", "fp8")."""
    a, b, op = _gemm_operands(m, n, k, dtype, layout, cfg.device)
    operand_bytes = (a.numel() + b.numel()) * a.element_size()
    sets = [(a, b)] + [
        (
            torch.randn_like(a, dtype=torch.float32).to(a.dtype),
            torch.randn_like(b, dtype=torch.float32).to(b.dtype),
        )
        for _ in range(input_sets_for(operand_bytes, cfg) - 1)
    ]
    with torch.no_grad(), math_mode(dtype):
        return per_call_s(op, sets, cfg)


def fp8_supported(device: str) -> bool:
    """fp8 GEMMs need float8 types, torch._scaled_mm and (on CUDA) compute capability 8.9+."""
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return False
    if torch.device(device).type == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        return False
    try:
        a, w, op = _gemm_operands(16, 16, 16, "fp8", "nt", device)
        op(a, w)
    except (RuntimeError, NotImplementedError):
        return False
    return True


# ---- convolution -------------------------------------------------------------------------------
def conv_out_hw(hw: int, kernel: int, stride: int) -> int:
    return (hw + 2 * (kernel // 2) - kernel) // stride + 1


def conv_flops(batch: int, cin: int, cout: int, hw: int, kernel: int, stride: int = 1) -> int:
    out = conv_out_hw(hw, kernel, stride)
    return 2 * batch * out * out * cout * cin * kernel * kernel


@dataclass(frozen=True, kw_only=True)
class ConvShape:
    batch: int
    cin: int
    cout: int
    hw: int  # square input, padding kernel // 2
    kernel: int
    stride: int = 1
    channels_last: bool = True

    @property
    def flops(self) -> int:
        return conv_flops(self.batch, self.cin, self.cout, self.hw, self.kernel, self.stride)


def conv_operands(shape: ConvShape, dtype: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    fmt = torch.channels_last if shape.channels_last else torch.contiguous_format
    dt = storage_dtype(dtype)
    x = torch.randn(shape.batch, shape.cin, shape.hw, shape.hw, device=device, dtype=dt)
    w = torch.randn(shape.cout, shape.cin, shape.kernel, shape.kernel, device=device, dtype=dt)
    return x.to(memory_format=fmt), (w / math.sqrt(w[0].numel())).to(memory_format=fmt)


def conv_s(
    shape: ConvShape, dtype: str, cfg: MeasureConfig, *, cudnn_benchmark: bool = True
) -> float:
    """Seconds per forward 2-D convolution (cuDNN autotuning on by default, as fast users run)."""
    x, w = conv_operands(shape, dtype, cfg.device)
    out = conv_out_hw(shape.hw, shape.kernel, shape.stride)
    io_bytes = (x.numel() + w.numel() + shape.batch * shape.cout * out * out) * x.element_size()
    sets = [(x,)] + [(torch.randn_like(x),) for _ in range(input_sets_for(io_bytes, cfg) - 1)]

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, stride=shape.stride, padding=shape.kernel // 2)

    with torch.no_grad(), math_mode(dtype, cudnn_benchmark=cudnn_benchmark):
        return per_call_s(op, sets, cfg)


# ---- copy and launch ---------------------------------------------------------------------------
def copy_bytes_per_s(nbytes: int, cfg: MeasureConfig) -> float:
    """Device-to-device copy: bytes read plus bytes written per second (bench.record's helper)."""
    return copy_bandwidth_bytes_per_s(
        nbytes=nbytes, device=cfg.device, repeats=max(cfg.repeats, 10)
    )


def _tiny_kernels(x: torch.Tensor, kernels: int) -> None:
    for _ in range(kernels):
        x.add_(1.0)


def launch_overhead_s(cfg: MeasureConfig, kernels: int = 1000) -> float:
    """Seconds per tiny kernel (a 1-element add) launched eagerly: the PyTorch + driver cost."""
    x = torch.randn(1, device=cfg.device)
    timing = time_fn(
        lambda: _tiny_kernels(x, kernels),
        warmup=1,
        repeats=max(3, cfg.repeats // 2),
        device=cfg.device,
    )
    return timing.median_s / kernels


def graph_launch_overhead_s(cfg: MeasureConfig, kernels: int = 1000) -> float:
    """Seconds per tiny kernel replayed from a CUDA graph (CUDA only)."""
    if torch.device(cfg.device).type != "cuda":
        raise ValueError("CUDA graphs need a CUDA device")
    x = torch.randn(1, device=cfg.device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as torch.cuda.graph asks
        _tiny_kernels(x, 3)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _tiny_kernels(x, kernels)
    timing = time_fn(graph.replay, warmup=1, repeats=max(3, cfg.repeats // 2), device=cfg.device)
    return timing.median_s / kernels
