"""How fast eager PyTorch kernels of each memory family move their bytes, against the copy rate.

For each family of `tracing/families.py`, one training step (or forward) of a workload that is
mostly that family (probe/workloads/: bf16, large enough to stream from memory) is traced by
gpushape on the meta device and timed on the GPU (a CUDA-graph replay: GPU time alone, what the
cost model prices). With the step's ops costed at the copy rate (efficiency 1),

    efficiency = (the family's ops' memory time) / (measured time - the other ops' time)

capped to [0.01, 1]. The profile keeps it under "memory_efficiency" and the cost model then
divides the family's memory time by it. Counting bytes with gpushape's own formulas keeps the
measurement and the prediction on one scale: the fraction absorbs whatever extra passes and
poor access patterns the eager kernels have.

The kernel floor (`measure_kernel_floor`): how long the GPU takes to run a kernel that has almost
nothing to do. The cost model prices a memory-bound kernel by its bytes at its family's rate,
which for a squeeze-and-excitation gate over 64 x 960 values comes to nanoseconds. No kernel is
that short: it is scheduled, its blocks start, its one wave drains. The profiler's times of such
modules on an H200 and an H100 (benchmarks/results/correlate-h200, correlate-h100: MobileNetV3's
and EfficientNet-B0's squeeze-and-excitation activations and gates) are 1.0-1.6 us a kernel;
priced without a floor they came to 0.01-0.06 of that. `Achievable.kernel_floor_s` is the floor;
it is measured as the median device time (torch.profiler, as those times were taken) of a few
elementwise and reduction kernels on a few kilobytes. A profiler session can leave CUPTI attached
and later launches in the process slower (bench/timer.py `kernel_times`): the probe measures the
floor after everything it times.

The graph-replay gap (`measure_graph_replay_gap`, the section at the end): the GPU's idle time
at a boundary between two CUDA graph replays, which graph-layers pays twice a captured layer.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..bench.timer import cuda_graph, kernel_times, time_fn
from ..hardware import GPUSpec
from .workloads import WORKLOADS, FamilyWorkload

__all__ = [
    "WORKLOADS",
    "FamilyWorkload",
    "LayerNormWeightGrad",
    "capped",
    "measure_family",
    "measure_graph_replay_gap",
    "measure_kernel_floor",
    "measure_memory_efficiency",
    "measure_weight_grad",
    "modeled_s",
]

_MIN_EFFICIENCY = 0.01


def _step(model: nn.Module, train: bool = True) -> Callable[[], Any]:
    params = list(model.parameters())
    # the output's gradient, made on the first (warm-up) call and kept: made every step, its
    # fill kernel (an output's worth of bytes) would be timed in the graph, and the traced step
    # the efficiency divides by has no such kernel
    seed: list[torch.Tensor] = []

    def step() -> Any:
        out = model()
        if not seed:
            seed.append(torch.ones_like(out))
        return torch.autograd.grad(out, params, seed[0])

    def forward() -> Any:
        with torch.no_grad():
            return model()

    return step if train else forward


def step_s(step: Callable[[], Any], device: str, repeats: int) -> float:
    """Median seconds of `step`: replayed from a CUDA graph on the GPU (GPU time alone, what
    the cost model prices), called directly on the CPU (a smoke test)."""
    if torch.device(device).type == "cuda":
        return time_fn(cuda_graph(step), warmup=3, repeats=repeats, device=device).median_s
    return time_fn(step, warmup=1, repeats=max(repeats // 4, 2), device=device).median_s


def capped(model_s: float, measured_s: float, most: float = 1.0) -> float:
    """model_s / measured_s, rounded, within [0.01, most] (0.01 where nothing was measured)."""
    ratio = model_s / measured_s if measured_s > 0 and model_s > 0 else _MIN_EFFICIENCY
    return round(min(max(ratio, _MIN_EFFICIENCY), most), 4)


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
    model = work.build(scale).to(dtype)
    family_s, other_s = modeled_s(work, model, spec)
    measured = step_s(_step(model.to(device), work.train), device, repeats)
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


class LayerNormWeightGrad(nn.Module):
    """A LayerNorm backward asked for the weight and bias gradients alone (output_mask False,
    True, True): the kernel that sums them over the rows, nothing else (tracing/norm_grads.py)."""

    def __init__(self, rows: int, width: int):
        super().__init__()
        self.width = width
        for name in ("dy", "x"):
            self.register_buffer(name, torch.randn(rows, width, dtype=torch.bfloat16))
        self.register_buffer("mean", torch.zeros(rows, 1))  # float32, as CUDA keeps them
        self.register_buffer("rstd", torch.ones(rows, 1))
        self.register_buffer("w", torch.ones(width, dtype=torch.bfloat16))

    def forward(self, _unused: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        # statistics in float32, as CUDA (and the meta trace) keep them for bf16 rows; PyTorch's
        # CPU kernel wants the rows' dtype (the smoke test)
        stat = self.dy.dtype if self.dy.device.type == "cpu" else torch.float32
        mean, rstd = self.mean.to(stat), self.rstd.to(stat)
        mask = [False, True, True]
        return torch.ops.aten.native_layer_norm_backward(
            self.dy, self.x, [self.width], mean, rstd, self.w, self.w, mask
        )[1:]


def measure_weight_grad(
    work: FamilyWorkload,
    spec: GPUSpec,
    *,
    device: str = "cuda",
    scale: float = 1.0,
    repeats: int = 20,
) -> dict[str, Any]:
    """The columns kernel of a LayerNorm backward (tracing/norm_grads.py): its modeled time at
    an SM's share of the copy rate over its measured time. `work.build` runs that kernel alone,
    forward-only, in bf16 with float32 statistics. Above 1 where one SM draws more than its
    share (capped at 4)."""
    from ..tracing.cost import op_cost
    from ..tracing.tracer import trace

    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    model = work.build(scale)
    family_s = other_s = 0.0
    for rec in trace(model, (), train=False).ops:
        c = op_cost(rec, flat)
        family_s += c.weight_grad_s
        other_s += c.kernel_time_s - c.weight_grad_s
    measured = step_s(_step(model.to(device), False), device, repeats)
    row = {
        "efficiency": capped(family_s, measured - other_s, most=4.0),
        "workload": work.describe,
        "dtype": "bfloat16",
        "measured_s": measured,
        "family_roofline_s": family_s,
        "other_roofline_s": other_s,
    }
    if scale != 1.0:
        row["scale"] = scale
    return row


def modeled_s(work: FamilyWorkload, model: nn.Module, spec: GPUSpec) -> tuple[float, float]:
    """(family_s, other_s) of `model`, the workload built (on the meta device will do), costed
    at the copy rate (every family at efficiency 1): the family's memory time (for gpushape's
    fused kernels, `work.passes` over its parameter), and the rest: the other ops' time, and
    what the family's ops run beside their bytes (a layout copy, a LayerNorm's weight-gradient
    kernel: tracing/cost.py)."""
    from ..tracing.cost import op_cost
    from ..tracing.families import memory_family
    from ..tracing.tracer import trace

    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    if work.passes:
        big = next(iter(model.inputs))
        rate = flat.attainable_bandwidth_bytes_per_s()
        return work.passes * big.numel() * big.element_size() / rate, 0.0
    family_s = other_s = 0.0
    for rec in trace(model, (), train=work.train).ops:
        c = op_cost(rec, flat)
        if memory_family(rec) == work.family.partition("@")[0]:  # "norm@768": norm
            family_s += c.memory_s
            other_s += c.layout_s + c.weight_grad_s
        else:
            other_s += c.kernel_time_s
    return family_s, other_s


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
            out.update(out[work.family].pop("derived", {}))  # rows one timing gives beside it
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # one family, reported
            out[work.family] = {
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "workload": work.describe,
            }
    return out


# the kernel floor (module docstring)
FLOOR_ELEMENTS = 4096  # 8 KB of bf16: far below a wave of any GPU's blocks
FLOOR_CALLS = 20  # profiled calls of each op (after warm-up)


def _tiny_ops(device: str) -> dict[str, Any]:
    x = torch.randn(FLOOR_ELEMENTS, device=device, dtype=torch.bfloat16)
    y = torch.randn(FLOOR_ELEMENTS, device=device, dtype=torch.bfloat16)
    return {
        "add": lambda: x + y,
        "mul": lambda: x * y,
        "sigmoid": lambda: torch.sigmoid(x),
        "sum": lambda: x.sum(),
        "fill": lambda: torch.zeros_like(x),
    }


def measure_kernel_floor(device: str = "cuda", calls: int = FLOOR_CALLS) -> dict[str, Any] | None:
    """{"seconds": the median kernel's device time, "by_op": microseconds per op, ...}: the
    kernel floor on `device`; None without CUDA (a CPU has no kernels to time)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    by_op: dict[str, float] = {}
    durations: list[float] = []
    for op, fn in _tiny_ops(device).items():
        kernels = kernel_times(fn, calls=calls, warmup=3)
        us = [t for kernel, t in kernels if not kernel.startswith(("Memset", "Memcpy"))]
        if not us:
            continue
        by_op[op] = round(statistics.median(us), 3)
        durations.extend(us)
    if not durations:
        return None
    return {
        "seconds": statistics.median(durations) * 1e-6,
        "by_op": by_op,
        "workload": f"add, mul, sigmoid, sum and a fill of {FLOOR_ELEMENTS} bf16 values, each "
        f"kernel's device time (torch.profiler, mean of {calls} calls), median over the ops",
        "kernels": len(durations),
    }


# ---- the GPU's wait at a boundary between two CUDA graph replays ----------------------------
# How long the GPU idles where one CUDA graph's replay ends and the next one's begins.
#
# graph-layers (transforms/graph_layers.py) replays each captured layer from two CUDA graphs a
# step, its forward and its backward, so a step of N captured layers launches 2N graphs where a
# whole-step graph launches one. Inside a graph the GPU idles about 0.25 us between kernels (the
# profile's `device_gap` "graph"); at a boundary between two graphs it waits longer, for the
# next graph's launch to reach it, even when the host queued that launch long before. The loop
# priced those boundaries at nothing, so it under-predicted what a whole-step graph saves after
# graph-layers (on an H100, 0.05 ms predicted for ResNet-50-GN's 16 captured layers against 0.21
# measured; `benchmarks/results/loops-h100-30`).
#
# `measure_graph_replay_gap` times, with the GPU held busy while the host queues everything,
# `GRAPHS` graphs of `KERNELS` in-place multiplications each, replayed back to back, against one
# graph holding all of those kernels; the difference over the boundaries (GRAPHS - 1) is the gap
# a replay adds. It goes into a profile as `device_gap["graph_replay"]`.
GRAPHS = 48  # graphs in the chain (graph-layers captures 12-24 layers: 24-48 launches a step)
KERNELS = 4  # kernels in each graph
ELEMENTS = 1 << 21  # 4 MB of float16 a kernel: a few microseconds on a Hopper GPU


def _graph(body: Any, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        body()  # warm-up on the side stream, as capture wants
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        body()
    return graph


def measure_graph_replay_gap(
    device: str = "cuda", repeats: int = 7, graphs: int = GRAPHS
) -> dict[str, Any] | None:
    """{"seconds": the GPU's idle time a graph replay adds, "chain_s", "single_s", ...};
    None without CUDA (a CPU replays no graphs)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    from ..bench.timer import hold_gpu

    buf = torch.ones(ELEMENTS, device=device, dtype=torch.float16)

    def kernels(n: int) -> Any:
        def body() -> None:
            for _ in range(n):
                buf.mul_(1.0)

        return body

    stream = torch.cuda.Stream()
    chain = [_graph(kernels(KERNELS), stream) for _ in range(graphs)]
    single = _graph(kernels(KERNELS * graphs), stream)
    torch.cuda.synchronize()

    def timed(run: Any) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_gpu(0.005)  # the host queues every launch before the GPU reaches the first
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def replay_chain() -> None:
        for g in chain:
            g.replay()

    for run in (replay_chain, single.replay):  # first replays
        timed(run)
    chain_s, single_s = [], []
    for _ in range(repeats):  # alternating
        chain_s.append(timed(replay_chain))
        single_s.append(timed(single.replay))
    chain_med, single_med = statistics.median(chain_s), statistics.median(single_s)
    return {
        "seconds": max(chain_med - single_med, 0.0) / (graphs - 1),
        "chain_s": chain_med,
        "single_s": single_med,
        "workload": f"{graphs} CUDA graphs of {KERNELS} in-place multiplications of "
        f"{ELEMENTS} float16 values replayed back to back, against one graph of all "
        f"{graphs * KERNELS}, the GPU held busy while the host queued them; CUDA events, "
        f"medians of {repeats} alternated rounds; the difference over the {graphs - 1} "
        "boundaries",
        "source": "gpushape.probe.memory.measure_graph_replay_gap",
    }
