"""Measuring training steps: warm-up, alternated timing, kernels, GPU busy time, peak memory.

Variants are timed in rounds, every variant in turn within a round, each over a block of
steps queued back to back (as a training loop queues them: the host runs ahead of the GPU)
between two CUDA events, so a drift of clock or temperature touches all of them alike. A
variant's figures are the median and quantiles of its blocks' per-step times.

A step is GPU-bound when the GPU is busy for most of it. torch.profiler gives the kernels one
step launches and their summed device time (busy time); the step's time from CUDA events
includes the gaps where the GPU waited for the host. Busy / step under BOUND_BUSY_FRACTION is
called host-bound: a fix that only shortens kernels saves little wall time there.

On a machine without CUDA every time is `perf_counter` around a block and there is no kernel
count, busy time or peak memory: enough to check the plumbing, not a measurement of a GPU.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass

import torch

from ..bench.timer import hold_gpu

BOUND_BUSY_FRACTION = 0.85


@dataclass(frozen=True, kw_only=True)
class StepStats:
    variant: str
    step_times_s: tuple[float, ...]
    warmup_s: float
    """Seconds from building the variant to the end of its first `warmup` steps: the rewrites
    and their numeric checks, compilation, autotuning, a CUDA graph's capture."""
    samples: int
    tokens: int
    peak_memory_bytes: int | None = None
    kernels: int | None = None
    """Kernels one step launches (None: no CUDA profiler here, or one CUDA graph)."""
    gpu_busy_s: float | None = None
    issue_s: float | None = None
    """Seconds the host takes to return from one step started on an idle GPU (median): its
    Python, dispatch and launches, plus any wait the step makes for the GPU (a sync); None
    without CUDA. Near the step time, the host sets the pace."""
    host_s: float | None = None
    """The same with the GPU held busy while the host issues the step (`held_issue_time`): the
    host's own time, with no wait on the GPU's progress in it; None without CUDA, or where the
    step still waited (its launches filled the queue, or it syncs)."""
    top_kernels: tuple[tuple[str, float], ...] = ()
    """The kernels that took the most GPU time in one step: (name, seconds), longest first."""
    flops: float | None = None
    """FLOPs of one step (forward and backward, from gpushape's trace)."""
    peak_flops: float | None = None
    """The chip's dense peak for the step's dtype (datasheet), for MFU."""
    measured_peak_flops: float | None = None
    """The largest aligned GEMM's rate `gpushape probe` measured on this chip for the step's
    dtype (the profile's), for `mfu_measured`; None where no profile measured it."""
    variant_flops: float | None = None
    """FLOPs of one step of this variant's own model, from its trace (a rewrite that changes
    the work shows here; None where the variant's model cannot be traced, a captured one)."""

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.step_times_s)
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.median_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.median_s if self.tokens else None

    @property
    def mfu(self) -> float | None:
        if not self.flops or not self.peak_flops:
            return None
        return self.flops / self.median_s / self.peak_flops

    @property
    def mfu_measured(self) -> float | None:
        """Model FLOPs per second over the chip's measured GEMM peak, not its datasheet's."""
        if not self.flops or not self.measured_peak_flops:
            return None
        return self.flops / self.median_s / self.measured_peak_flops

    @property
    def busy_fraction(self) -> float | None:
        return None if self.gpu_busy_s is None else min(self.gpu_busy_s / self.median_s, 1.0)

    @property
    def bound(self) -> str:
        if self.busy_fraction is None:
            return "unknown"
        return "GPU" if self.busy_fraction >= BOUND_BUSY_FRACTION else "host"

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            median_s=self.median_s,
            p10_s=self.quantile(0.1),
            p90_s=self.quantile(0.9),
            samples_per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
            mfu_measured=self.mfu_measured,
            busy_fraction=self.busy_fraction,
            bound=self.bound,
        )
        return data


# kernels a step keeps by name, longest first: enough to tell two stages of a loop apart
# (a fix that changes a few kernels by a fraction of a millisecond each)
TOP_KERNELS = 40


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def warm(step: Callable[[], object], calls: int = 3, *, cuda: bool | None = None) -> float:
    """Seconds the first `calls` steps take, to the end of their GPU work."""
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    if _cuda() if cuda is None else cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def issue_time(
    step: Callable[[], object], calls: int = 5, *, cuda: bool | None = None
) -> float | None:
    """Median seconds for `step()` to return when started on an idle GPU (synchronised before,
    not after); None without CUDA (the CPU runs the step itself)."""
    if not (_cuda() if cuda is None else cuda):
        return None
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times)


HOLD_MAX_S = 2.0  # the longest the GPU is held busy for one measurement


def held_issue_time(
    step: Callable[[], object], calls: int = 5, *, cuda: bool | None = None
) -> float | None:
    """Median seconds for `step()` to return while a kernel queued before it keeps the GPU busy
    longer than the host takes: the host's own time for the step, which `issue_time` (from an
    idle GPU) can exceed where the host waits on the GPU mid-step. None without CUDA, or where
    the step returned only after the hold ended (it waited: the launch queue filled, or a
    sync), so that no figure here includes a wait."""
    if not (_cuda() if cuda is None else cuda):
        return None
    guess = issue_time(step, calls=1, cuda=True) or 0.0
    hold_s = min(max(4 * guess, 0.05), HOLD_MAX_S)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        hold_gpu(hold_s)
        t0 = time.perf_counter()
        step()
        took = time.perf_counter() - t0
        torch.cuda.synchronize()
        if took >= 0.9 * hold_s:
            return None
        times.append(took)
    return statistics.median(times)


def time_blocks(
    steps: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 5,
    block: int = 10,
    cuda: bool | None = None,
    settled: Callable[[dict[str, list[float]]], bool] | None = None,
    max_rounds: int | None = None,
) -> dict[str, list[float]]:
    """Seconds per step for each variant: `rounds` rounds, each variant in turn, `block`
    steps a block; one value per block. With `settled`, more rounds follow, one at a time,
    until it says the times so far settle what they are for, or `max_rounds` have run."""
    if rounds < 1 or block < 1:
        raise ValueError(f"need rounds >= 1 and block >= 1, got {rounds}, {block}")
    times: dict[str, list[float]] = {name: [] for name in steps}
    cuda = _cuda() if cuda is None else cuda
    done = 0
    while done < rounds or (
        settled is not None and done < (max_rounds or rounds) and not settled(times)
    ):
        done += 1
        for name, step in steps.items():
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(block):
                    step()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 1e3 / block)
            else:
                t0 = time.perf_counter()
                for _ in range(block):
                    step()
                times[name].append((time.perf_counter() - t0) / block)
    return times


@contextlib.contextmanager
def peak_memory(cuda: bool | None = None) -> Iterator[dict[str, int]]:
    """The most CUDA memory allocated inside the block beyond what was allocated before it,
    as `{"bytes": n}` once the block ends (empty without CUDA). Around a variant's build and
    warm-up this is all it needs: its copy of the weights, optimizer state, gradients,
    activations and workspaces, but not the other variants' memory. A reset of the peak inside
    the block (after the build) leaves out what the build held only for a while (optimize's
    numeric checks) while keeping what it still holds. CUDA graphs captured in the block keep
    their working memory in private pools that the allocator counts as free between replays
    (a replay allocates nothing): the free bytes of the private pools the block created are
    added, so a graphed step's figure holds its activations too."""
    result: dict[str, int] = {}
    if not (_cuda() if cuda is None else cuda):
        yield result
        return
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    pools_before = set(_private_pool_free(_snapshot()))
    torch.cuda.reset_peak_memory_stats()
    yield result
    torch.cuda.synchronize()
    new_pools = _private_pool_free(_snapshot())
    graphs = sum(free for pool, free in new_pools.items() if pool not in pools_before)
    result["bytes"] = int(torch.cuda.max_memory_allocated() - before + graphs)


def _snapshot() -> list[dict]:
    try:
        return torch.cuda.memory_snapshot()
    except Exception:  # an allocator without snapshots: no pools to add
        return []


def _private_pool_free(segments: list[dict]) -> dict[tuple, int]:
    """Bytes reserved and not allocated in each private memory pool (a CUDA graph's), by pool
    id; the default pool, (0, 0), left out."""
    free: dict[tuple, int] = {}
    for seg in segments:
        pool = tuple(seg.get("segment_pool_id") or (0, 0))
        if pool != (0, 0):
            unused = int(seg.get("total_size", 0)) - int(seg.get("allocated_size", 0))
            free[pool] = free.get(pool, 0) + max(unused, 0)
    return free


def kernel_profile(
    step: Callable[[], object], calls: int = 3, *, cuda: bool | None = None, top: int = TOP_KERNELS
) -> tuple[int | None, float | None, tuple[tuple[str, float], ...]]:
    """(kernels per step, GPU busy seconds per step, the `top` kernels by GPU seconds per step)
    from torch.profiler over `calls` steps; (None, None, ()) without CUDA. Busy time counts
    copies and memsets as well as kernels (graph-layers' copies into its graphs' input buffers
    are device-to-device copies: left out, they read as idle GPU); the kernel count and the top
    list are kernels only. A CUDA graph's replay shows as the kernels it ran (CUPTI sees them)
    when the driver reports them, else as none: then busy time is unknown too."""
    if not (_cuda() if cuda is None else cuda):
        return None, None, ()
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type.name == "CUDA"]
    kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
    if not kernels:
        return None, None, ()
    busy = sum(e.device_time for e in device) * 1e-6  # device_time is in microseconds
    return len(kernels) // calls, busy / calls, top_by_time(kernels, calls, top)


def top_by_time(events, calls: int, top: int) -> tuple[tuple[str, float], ...]:
    """Kernel events summed by name (cut to 120 characters), seconds per step, longest first."""
    per: dict[str, float] = {}
    for e in events:
        name = e.name[:120]
        per[name] = per.get(name, 0.0) + e.device_time * 1e-6 / calls
    return tuple(sorted(per.items(), key=lambda kv: -kv[1])[:top])
