"""`recommend_loader`: DataLoader settings from a measured per-batch load time and the cores.

The input pipeline keeps up when the workers together produce a batch faster than the GPU
consumes one: load time per batch / num_workers < step time. The load time is measured here, in
this process (num_workers=0: fetch and collate `sample_batches` batches, the first a warm-up that
is not counted when there are more); the step time is the caller's target (e.g. the measured
step of a synthetic-data run). Without a target every core but the main process's goes to
loading. The audit's `dataloader` rule can call it through `advice_for_loader` with
`sample_batches=0` (no data read: cores and CUDA only).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from ._tree import iter_tensors
from .errors import DataPipelineError

HOST_MEMORY_SHARE = 0.1  # at most this share of RAM held in prefetched batches


@dataclass(frozen=True, kw_only=True)
class LoaderAdvice:
    """Recommended DataLoader settings, the numbers they came from, and why (one line each)."""

    batch_size: int
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None  # batches each worker keeps ready; None without workers
    cores: int  # CPU cores this process may run on
    load_s_per_batch: float | None  # median in-process fetch + collate time; None: not measured
    sample_times_s: tuple[float, ...]
    batch_bytes: int | None  # tensor bytes of one collated batch
    target_step_s: float | None
    expected_load_s_per_batch: float | None  # load_s_per_batch / num_workers (or itself at 0)
    keeps_up: bool | None  # expected load per batch below the target step; None: unknown
    reasoning: tuple[str, ...]

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `torch.utils.data.DataLoader(dataset, **kwargs)`."""
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
        }
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs

    def changes(self, loader: Any) -> dict[str, tuple[Any, Any]]:
        """Settings where `loader` differs from the advice: name -> (current, recommended)."""
        out = {}
        for name, want in self.loader_kwargs().items():
            have = getattr(loader, name, None)
            if name == "prefetch_factor" and getattr(loader, "num_workers", 0) == 0:
                have = None
            if have != want:
                out[name] = (have, want)
        return out


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def recommend_loader(
    dataset: Any,
    batch_size: int,
    *,
    max_workers: int | None = None,
    sample_batches: int = 4,
    target_step_s: float | None = None,
    collate_fn: Any = None,
    cuda: bool | None = None,
    headroom: float = 1.25,
) -> LoaderAdvice:
    """Advice for loading `dataset` in batches of `batch_size` (see the module docstring).

    `headroom` multiplies the measured load time before it is shared among workers: workers
    also pay for shipping batches between processes and share the caches. `cuda` overrides
    whether CUDA is there (pin_memory); `sample_batches=0` measures nothing.
    """
    _check_args(dataset, batch_size, max_workers, sample_batches, target_step_s, headroom)
    cores = cores_available()
    times, batch_bytes = _measure(dataset, batch_size, sample_batches, collate_fn)
    counted = times[1:] if len(times) > 1 else times  # the first batch warms caches up
    load = statistics.median(counted) if counted else None
    why = [f"{cores} CPU cores available to this process; one stays with the main process"]
    if load is not None:
        why.append(
            f"measured {len(counted)} batches of {batch_size} in-process (num_workers=0, after "
            f"{len(times) - len(counted)} warm-up): median {load * 1e3:.1f} ms per batch to fetch "
            f"and collate ({batch_size / load:.0f} samples/s on one core)"
        )
    workers = _workers(cores, load, target_step_s, max_workers, headroom, why)
    expected = None if load is None else load / max(workers, 1)
    keeps_up = None if expected is None or target_step_s is None else expected < target_step_s
    pin = torch.cuda.is_available() if cuda is None else bool(cuda)
    why.append(
        "CUDA available: pin_memory=True, so copies can run with non_blocking=True"
        if pin
        else "no CUDA: pin_memory=False (pinned pages only help host-to-device copies)"
    )
    if workers > 0:
        why.append("persistent_workers=True: workers are not re-spawned every epoch")
    prefetch = _prefetch_factor(workers, counted, expected, target_step_s, batch_bytes, why)
    return LoaderAdvice(
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=workers > 0,
        prefetch_factor=prefetch,
        cores=cores,
        load_s_per_batch=load,
        sample_times_s=tuple(times),
        batch_bytes=batch_bytes,
        target_step_s=target_step_s,
        expected_load_s_per_batch=expected,
        keeps_up=keeps_up,
        reasoning=tuple(why),
    )


def advice_for_loader(loader: Any, **options: Any) -> LoaderAdvice:
    """`recommend_loader` for an existing DataLoader's dataset, batch size and collate_fn;
    `sample_batches` defaults to 0 here (advice from the cores alone, no data read)."""
    batch_size = getattr(loader, "batch_size", None)
    if batch_size is None:
        raise DataPipelineError(
            "the DataLoader has no batch_size (it uses a batch_sampler): call recommend_loader "
            "with the batch size"
        )
    options.setdefault("sample_batches", 0)
    options.setdefault("collate_fn", getattr(loader, "collate_fn", None))
    return recommend_loader(loader.dataset, batch_size, **options)


def _check_args(
    dataset: Any,
    batch_size: Any,
    max_workers: Any,
    sample_batches: Any,
    target_step_s: Any,
    headroom: Any,
) -> None:
    if not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__")):
        raise DataPipelineError(
            f"dataset must be a map-style or iterable dataset, got {type(dataset).__name__}"
        )
    for name, value, low in (("batch_size", batch_size, 1), ("sample_batches", sample_batches, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DataPipelineError(f"{name} must be an integer >= {low}, got {value!r}")
    if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 0):
        raise DataPipelineError(f"max_workers must be None or an integer >= 0, got {max_workers!r}")
    if target_step_s is not None and not target_step_s > 0:
        raise DataPipelineError(f"target_step_s must be positive seconds, got {target_step_s!r}")
    if not headroom >= 1:
        raise DataPipelineError(f"headroom must be >= 1, got {headroom!r}")


def _measure(
    dataset: Any, batch_size: int, batches: int, collate_fn: Any
) -> tuple[list[float], int | None]:
    """Seconds to fetch and collate each of the first `batches` batches, and one batch's bytes."""
    if batches == 0:
        return [], None
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=0, collate_fn=collate_fn)
    source = iter(loader)
    times, nbytes = [], None
    for _ in range(batches):
        start = time.perf_counter()
        try:
            batch = next(source)
        except StopIteration:
            break
        times.append(time.perf_counter() - start)
        if nbytes is None:
            nbytes = sum(t.nbytes for t in iter_tensors(batch))
    if not times:
        raise DataPipelineError("the dataset gave no batch to measure: is it empty?")
    return times, nbytes


def _workers(
    cores: int,
    load: float | None,
    target: float | None,
    max_workers: int | None,
    headroom: float,
    why: list[str],
) -> int:
    """All but one core, or just enough that load * headroom / workers < target."""
    spare = cores - 1
    if load is None or target is None:
        workers = spare
        why.append(
            f"no {'measurement' if load is None else 'target step'}: all but one core, "
            f"{spare} worker(s)"
        )
    else:
        needed = math.floor(load * headroom / target) + 1
        workers = min(needed, spare)
        why.append(
            f"target step {target * 1e3:.1f} ms: {needed} worker(s) keep loading below it "
            f"({load * 1e3:.1f} ms x {headroom:g} headroom / {needed}); {spare} cores to spare"
        )
        if needed > spare:
            why.append(
                f"input-bound: {spare} spare cores load a batch in "
                f"{load / max(spare, 1) * 1e3:.1f} ms against a {target * 1e3:.1f} ms step; "
                "pre-decode, shrink images or add cores"
            )
    if max_workers is not None and workers > max_workers:
        workers = max_workers
        why.append(f"capped at max_workers={max_workers}")
    if workers == 0:
        why.append("num_workers=0: loading runs on the training thread, in series with each step")
    return workers


def _prefetch_factor(
    workers: int,
    times: list[float],
    expected: float | None,
    target: float | None,
    batch_bytes: int | None,
    why: list[str],
) -> int | None:
    """2 when loading has slack, up to 4 when it is tight or jittery; 2 if RAM would suffer."""
    if workers == 0:
        return None
    if expected is not None and target is not None:
        ratio = expected / target
        factor = 2 if ratio < 0.5 else 3 if ratio < 0.8 else 4
        why.append(f"prefetch_factor={factor}: loading takes {ratio:.0%} of the step")
    elif len(times) > 1 and max(times) > 1.5 * statistics.median(times):
        factor = 4
        why.append("prefetch_factor=4: batch load times vary by more than 1.5x")
    else:
        factor = 2
        why.append("prefetch_factor=2: the default keeps two batches per worker ready")
    ram = _host_memory_bytes()
    if (
        batch_bytes
        and ram
        and factor > 2
        and workers * factor * batch_bytes > HOST_MEMORY_SHARE * ram
    ):
        factor = 2
        why.append(
            f"prefetch_factor=2: more buffered batches would hold over "
            f"{HOST_MEMORY_SHARE:.0%} of host memory"
        )
    return factor


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
