"""Runtime helpers of the batch_norm_act launchers: occupancy and last-program counters
(launches go through `_launch.Launch`)."""

from __future__ import annotations

import ctypes
import functools

import torch

# Programs an SM holds when the CUDA occupancy query is unavailable.
_FALLBACK_PROGRAMS_PER_SM = 4
# The interpreter runs programs one after another: a few programs keep CI fast and still
# exercise the multi-program partial sums.
_INTERPRETER_PROGRAMS = 3


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=1)
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


@functools.cache
def _occupancy(function: int, threads: int, shared_bytes: int) -> int:
    count = ctypes.c_int(0)
    try:
        err = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(count),
            ctypes.c_void_p(function),
            ctypes.c_int(threads),
            ctypes.c_size_t(shared_bytes),
        )
    except OSError:
        err = -1
    return count.value if err == 0 and count.value > 0 else _FALLBACK_PROGRAMS_PER_SM


def programs_per_sm(compiled) -> int:
    """Programs of a compiled kernel resident on one SM at once (CUDA occupancy API)."""
    try:
        compiled._init_handles()  # loads the module: sets compiled.function
        threads = compiled.metadata.num_warps * getattr(compiled.metadata, "warp_size", 32)
        return _occupancy(compiled.function, threads, compiled.metadata.shared)
    except AttributeError:  # a Triton without these internals
        return _FALLBACK_PROGRAMS_PER_SM


def resident_programs(kernel, args: list, meta: dict) -> int:
    """How many programs of `kernel` (compiled for these arguments) fit on the whole GPU at
    once; on the interpreter, a small number."""
    device = next(a for a in args if isinstance(a, torch.Tensor)).device
    if device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    compiled = kernel.warmup(*args, grid=(1,), **meta)  # compiles; no launch
    return sm_count(device.index) * programs_per_sm(compiled)


_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def counters(x: torch.Tensor, n: int) -> torch.Tensor:
    """(>= n,) int32 zeros for the reductions' last-program counts. The kernels leave them at
    zero, so one buffer per (device, stream) serves every launch in stream order; a CUDA-graph
    capture gets its own (zeroed inside the graph)."""
    if x.is_cuda:
        index = x.get_device()
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(n, dtype=torch.int32, device=x.device)
        key = (index, torch._C._cuda_getCurrentRawStream(index))
    else:
        key = (-1, 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=x.device)
    return buf
