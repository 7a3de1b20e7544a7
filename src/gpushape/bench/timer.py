"""The one timing primitive gpushape uses.

CUDA events around each repeat on a GPU, `perf_counter` after a synchronisation on the CPU; a
warm-up first; N repeats; median and quantiles. Optionally the L2 is flushed before every repeat
(a buffer of twice the L2 size, from the GPUSpec, is overwritten outside the timed region), and
the inputs rotate over several sets so that a cached input does not flatter the result.

On a GPU the repeats are queued back to back and synchronised once at the end (as in a training
step, where the CPU runs ahead of the GPU): each event pair measures GPU time, and host-side
overhead (Python, dispatch, autograd) shows only where it exceeds the GPU work, as it would in a
real model. `sync_each=True` synchronises after every repeat instead, so each repeat also pays
the host's launch latency: the latency of one isolated call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..hardware import GPUSpec, current_gpu, get_gpu


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeats` timed calls."""

    times_s: tuple[float, ...]
    method: str  # "cuda-events" or "perf_counter"
    warmup: int
    flushed_l2: bool
    input_sets: int

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile, q in [0, 1]."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must lie in [0, 1], got {q}")
        ordered = sorted(self.times_s)
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    @property
    def p10_s(self) -> float:
        return self.quantile(0.1)

    @property
    def p90_s(self) -> float:
        return self.quantile(0.9)

    def describe(self) -> str:
        return (
            f"median {self.median_s * 1e3:.4f} ms (p10 {self.p10_s * 1e3:.4f}, "
            f"p90 {self.p90_s * 1e3:.4f}) of {self.repeats} by {self.method}"
        )


def _is_cuda(device: torch.device | str | None) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _l2_flusher(cuda: bool, gpu: GPUSpec | str | None, device: Any) -> Callable[[], None]:
    if gpu is None and cuda:
        gpu = current_gpu()
    if gpu is None:
        raise ValueError("flush_l2=True needs a GPUSpec (gpu=...) to size the flush buffer")
    spec = get_gpu(gpu)
    buffer = torch.empty(2 * spec.l2_bytes // 4, dtype=torch.int32, device=device)
    return lambda: buffer.fill_(1)


def time_fn(
    fn: Callable[..., Any],
    *,
    inputs: Sequence[Sequence[Any]] | None = None,
    warmup: int = 3,
    repeats: int = 20,
    flush_l2: bool = False,
    gpu: GPUSpec | str | None = None,
    device: torch.device | str | None = None,
    sync_each: bool = False,
) -> Timing:
    """Time `fn(*inputs[i % len(inputs)])` (or `fn()`), `repeats` times after `warmup` calls.

    `device` defaults to the device of the first tensor in `inputs`, else CUDA when available.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    sets = [tuple(s) for s in inputs] if inputs else [()]
    if device is None:
        first = next((a for s in sets for a in s if isinstance(a, torch.Tensor)), None)
        if first is not None:
            device = first.device
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = _is_cuda(device)
    flush = _l2_flusher(cuda, gpu, device) if flush_l2 else None
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    times: list[float] = []
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    for i in range(repeats):
        args = sets[i % len(sets)]
        if flush is not None:
            flush()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            events.append((start, end))
            if sync_each:
                end.synchronize()
        else:
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
    sync()
    times.extend(start.elapsed_time(end) / 1e3 for start, end in events)
    return Timing(
        tuple(times),
        "cuda-events" if cuda else "perf_counter",
        warmup,
        flush is not None,
        len(sets),
    )


def compare(
    variants: Mapping[str, Callable[..., Any]],
    *,
    rounds: int = 5,
    repeats_per_round: int = 10,
    **kwargs: Any,
) -> dict[str, Timing]:
    """Time several variants of one job alternately: round r times every variant in turn, so a
    clock or thermal drift touches all of them alike. Returns each variant's pooled timings."""
    pooled: dict[str, list[float]] = {name: [] for name in variants}
    last: dict[str, Timing] = {}
    for _ in range(rounds):
        for name, fn in variants.items():
            timing = time_fn(fn, repeats=repeats_per_round, **kwargs)
            pooled[name].extend(timing.times_s)
            last[name] = timing
    return {
        name: Timing(
            tuple(pooled[name]),
            last[name].method,
            last[name].warmup,
            last[name].flushed_l2,
            last[name].input_sets,
        )
        for name in variants
    }


def cuda_graph(fn: Callable[[], Any], *, warmup: int = 3) -> Callable[[], None]:
    """`fn` captured in a CUDA graph; returns the graph's replay. Warm-up calls run on a side
    stream first (allocator pools, cuBLAS workspaces, autotuning), as capture requires. Timing
    the replay gives GPU time alone: no Python, launch, autograd or allocator cost. Raises
    RuntimeError without CUDA, and whatever the capture raises when fn cannot be captured.

    The replay holds `fn`, and so whatever tensors fn's closure owns: the graph reads and
    writes their memory, which must outlive it (a replay over freed inputs reads whatever was
    allocated there since, or faults)."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_graph: needs a CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay() -> None:
        graph.replay()

    replay.graph, replay.captured = graph, fn  # type: ignore[attr-defined]
    return replay


def kernel_times(
    fn: Callable[[], Any], *, calls: int = 3, warmup: int = 3, name_chars: int = 90
) -> list[tuple[str, float]]:
    """The CUDA kernels one call of `fn` launches, in launch order, each with its device time
    in microseconds (the mean over `calls` calls under torch.profiler, after `warmup` calls).
    For finding where a step's time goes; time with `time_fn` / `cuda_graph`, and before this:
    a finished profiler session can leave CUPTI attached and every later launch in the process
    slower (pytorch/pytorch#144455; Kineto detaches it when TEARDOWN_CUPTI=1)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    per = len(events) // calls
    return [
        (e.name[:name_chars], sum(x.device_time for x in events[i::per]) / calls)
        for i, e in enumerate(events[:per])
    ]


def kernel_totals(fn: Callable[[], Any], **kwargs: Any) -> dict[str, float]:
    """`kernel_times` summed by kernel name: device microseconds a call (a kernel launched
    several times a step counts once, with all its time)."""
    totals: dict[str, float] = {}
    for name, us in kernel_times(fn, **kwargs):
        totals[name] = totals.get(name, 0.0) + us
    return totals


_CYCLES_PER_S: list[float] = []


def gpu_cycles_per_s() -> float:
    """The current GPU's clock as `torch.cuda._sleep` counts it, measured once."""
    if not _CYCLES_PER_S:
        cycles = 50_000_000
        torch.cuda._sleep(cycles // 10)  # warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_S.append(cycles / (start.elapsed_time(end) / 1e3))
    return _CYCLES_PER_S[0]


def hold_gpu(seconds: float) -> None:
    """Queue a kernel that keeps the current stream busy for about `seconds`: what is queued
    after it waits, so the host issuing that work meanwhile never waits on the GPU's progress
    (the host's own time for it, where its launches do not fill the queue)."""
    torch.cuda._sleep(int(seconds * gpu_cycles_per_s()))
