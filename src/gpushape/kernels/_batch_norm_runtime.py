"""Runtime helpers of the batch_norm_act launchers: occupancy, last-program counters, and a
launcher that skips Triton's per-call JIT dispatch once a kernel is compiled."""

from __future__ import annotations

import ctypes
import functools

import torch

# Switch for the direct launcher (benchmarks/kernels/tune_batch_norm_act.py compares both).
FAST_LAUNCH = True
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
            ctypes.byref(count), ctypes.c_void_p(function), ctypes.c_int(threads),
            ctypes.c_size_t(shared_bytes))
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


# ---- launching ----

def aligned(*tensors) -> bool:
    """Every given tensor (None skipped) starts 16-byte aligned (what Triton specialises on)."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits & 15 == 0


class Launch:
    """One kernel with its grid and constexprs fixed. The first call goes through Triton's JIT
    (compiles, specialises on the arguments); later calls whose tensors are all 16-byte aligned
    (`aligned`: as Triton assumed for the ones it first saw; the callers' own buffers always
    are) call the compiled kernel's launcher directly."""

    __slots__ = ("consts", "grid", "kernel", "meta", "runner")

    def __init__(self, kernel, grid: int, meta: dict, n_args: int):
        self.kernel, self.grid, self.meta = kernel, (grid,), meta
        # constexpr values in parameter order: the compiled launcher takes every parameter
        self.consts = tuple(meta[name] for name in kernel.arg_names[n_args:])
        self.runner = None

    def __call__(self, is_aligned: bool, *args) -> None:
        global FAST_LAUNCH
        runner = self.runner
        if runner is not None and is_aligned and FAST_LAUNCH:
            try:
                runner(*args, *self.consts)
                return
            except (TypeError, ValueError):  # a Triton whose launcher takes other arguments
                FAST_LAUNCH = False
        compiled = self.kernel[self.grid](*args, **self.meta)
        if hasattr(compiled, "result"):  # a Triton that compiles asynchronously
            compiled = compiled.result()
        if runner is None and is_aligned and hasattr(compiled, "__getitem__"):
            self.runner = compiled[self.grid]  # since Triton 3.3: takes every parameter
