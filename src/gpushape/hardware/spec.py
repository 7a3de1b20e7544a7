"""`GPUSpec`: what a chip is, as numbers with units in their names.

Theoretical peaks (datasheet) and achievable fractions (assumed, or measured by `gpushape probe`)
are kept apart: `peak_flops()` is the datasheet, `attainable_flops()` applies the fraction.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Canonical dtype keys used in every per-dtype table of this package.
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")

_DTYPE_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "f64": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "tensorfloat32": "tf32",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "int8": "int8",
    "uint8": "int8",
}


def dtype_key(dtype: Any) -> str:
    """'bf16' for torch.bfloat16, 'bfloat16', 'BF16'...; raises ValueError for anything else."""
    text = str(dtype).lower().removeprefix("torch.")
    key = text if text in DTYPES else _DTYPE_ALIASES.get(text)
    if key is None:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return key


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, kw_only=True)
class SMLimits:
    """Per-SM resource limits (CUDA programming guide, table of compute-capability features)."""

    max_threads: int
    max_warps: int
    max_blocks: int
    registers: int  # 32-bit registers per SM
    shared_mem_bytes: int  # configurable shared memory per SM, at its largest
    max_shared_mem_per_block_bytes: int


ATTENTION_PROBE_SEQ = 1024  # the sequence length of the probe's attention calls (probe/plan.py)


def _by_length(rates: Mapping[int, float], seq: int) -> float:
    """A rate measured at several sequence lengths, at `seq`: linear in log2 of the length
    between the two measured around it, the nearest one's outside them."""
    lengths = sorted(rates)
    if seq <= lengths[0]:
        return rates[lengths[0]]
    if seq >= lengths[-1]:
        return rates[lengths[-1]]
    hi = next(n for n in lengths if n >= seq)
    lo = max(n for n in lengths if n <= seq)
    if hi == lo:
        return rates[lo]
    w = math.log2(seq / lo) / math.log2(hi / lo)
    return rates[lo] + w * (rates[hi] - rates[lo])


@dataclass(frozen=True, kw_only=True)
class Achievable:
    """What real kernels reach, as fractions of the datasheet, plus launch costs.

    Defaults are assumptions (`source="assumed"`); `gpushape probe` replaces them with
    measurements and names the fields it measured in `measured`.
    """

    gemm_fraction: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"default": 0.75})
    )  # large aligned GEMM / tensor-core peak, by dtype key or "default"
    memory_bandwidth_fraction: float = 0.88  # device-to-device copy / datasheet bandwidth
    launch_overhead_s: float = 5e-6  # one eager kernel launch, CPU side, PyTorch dispatch incl.
    graph_launch_overhead_s: float = 1.5e-6  # one kernel replayed from a CUDA graph
    # A GEMM or convolution kernel's time beyond its FLOPs at the shape's rate: filling the
    # pipeline, the last tiles' epilogue, the tail (tracing/gemm_model.py). `gpushape probe` fits
    # it on its GEMM sweeps; the default is what the H200's and H100's sweeps gave (4 us).
    gemm_latency_s: float = 4e-6
    # The shortest any other kernel runs on the GPU: a kernel over a few kilobytes is not
    # done in nanoseconds (its blocks start, its one wave drains). `gpushape probe` measures it
    # (probe/memory.py); the default is what fitted the profiler's times of tiny modules on the
    # H200 and the H100 (tracing/cost.py).
    kernel_floor_s: float = 1.5e-6
    # Eager kernels' bandwidth / the copy rate, by memory family (tracing/families.py); measured
    # by `gpushape probe`. A family not here runs at the copy rate.
    memory_efficiency: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    # A convolution with fewer input channels per group than the tensor-core alignment (an RGB
    # stem): its rate / the GEMM model's rate for its shape; 0: not measured (tracing/gemm_model.py
    # then applies its generic misalignment penalty).
    small_cin_conv: float = 0.0
    # Fused attention kernels: their rate / the GEMM model's rate, by
    # "backend/pass[/dropout][/causal]/d<head size>" ("flash/bwd/dropout/d64"); measured by
    # `gpushape probe` (probe/attention.py). Unmeasured: the model's rate.
    attention: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    # The host's side of an eager step, seconds per call, measured by `gpushape probe`
    # (probe/host.py): "op" (an ATen op recorded for autograd, its launch included), "view",
    # "backward_op" (one op the autograd engine runs in backward, launch included), "module"
    # (an nn.Module call's own Python). Empty: unmeasured (the host is then kernels x launch).
    host: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    # How far the host's side may be from these rates (a log-normal's sigma, auditing/modes.py);
    # None: the spread between the hosts the rates were measured on. A host measured where the
    # step runs is known closer (steps/host_here.py).
    host_spread: float | None = None
    # The GPU's idle time from one kernel to the next where the host keeps it fed, seconds a
    # kernel, by how the step runs: "eager", "compile", "graph" (the whole step replayed from
    # one CUDA graph), "compile-graphs" (torch.compile's CUDA graphs); fitted on GPU-bound
    # timed steps, their wall clock less their kernels' busy time
    # (benchmarks/steps/fit_device_gap.py); "<kind>/step": a time a step beside it, where the
    # fit found the idle time follows the step more than its kernels. Empty: unmeasured.
    device_gap: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    # An optimizer step's multi-tensor kernels (torch.optim's foreach and fused steps), fitted
    # on timed steps (benchmarks/steps/fit_optimizer_kernels.py): "<impl>" (foreach, fused) or
    # "<impl>/<class>" (fused/AdamW) the fraction of the copy rate their bytes move at, and
    # "<impl>/tensor" the seconds each parameter tensor adds to each such kernel (a small
    # tensor's blocks, the launches a long list splits into). Empty: bytes at the copy rate.
    optimizer_kernels: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    source: str = "assumed"
    measured: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_efficiency", _frozen(self.memory_efficiency))
        object.__setattr__(self, "attention", _frozen(self.attention))
        object.__setattr__(self, "host", _frozen(self.host))
        object.__setattr__(self, "device_gap", _frozen(self.device_gap))
        object.__setattr__(self, "optimizer_kernels", _frozen(self.optimizer_kernels))

    def gemm(self, dtype: str) -> float:
        return self.gemm_fraction.get(dtype, self.gemm_fraction.get("default", 0.75))

    def memory(self, family: str | None) -> float:
        """The fraction of the copy rate kernels of `family` reach (1 when not measured)."""
        return self.memory_efficiency.get(family, 1.0) if family else 1.0

    def attention_rate(
        self,
        backend: str,
        backward: bool,
        dropout: bool,
        causal: bool,
        head_dim: int,
        gqa: bool = False,
        seq: int = 0,
    ) -> float:
        """The measured factor for one fused attention kernel (1 when nothing fits): the
        configuration with the same backend, pass and flags at the nearest measured head size;
        failing that, without the grouped-query flag, then without the causal flag, then
        without dropout. A flash call is priced at the rate of what SDPA picks by itself
        ("default", probe/attention.py: cuDNN's kernel on the H200) where that was measured.
        Where that configuration was also measured at other sequence lengths ("...@t256"; a
        key without "@t" is at ATTENTION_PROBE_SEQ), the rate at `seq` is interpolated between
        them in log2 of the length, and held at the nearest one outside them (`seq` 0: the
        probe's own length)."""
        if not self.attention or head_dim <= 0:
            return 1.0
        for name in ("default", "flash") if backend == "flash" else (backend,):
            rate = self._attention_rate(name, backward, dropout, causal, head_dim, gqa, seq)
            if rate is not None:
                return rate
        return 1.0

    def _attention_rate(
        self,
        backend: str,
        backward: bool,
        dropout: bool,
        causal: bool,
        head_dim: int,
        gqa: bool,
        seq: int,
    ) -> float | None:
        stage = "bwd" if backward else "fwd"
        tried = ((dropout, causal, gqa), (dropout, causal, False), (dropout, False, False),
                 (False, causal, False), (False, False, False))  # fmt: skip
        for flags in dict.fromkeys(tried):
            named = (("dropout", flags[0]), ("causal", flags[1]), ("gqa", flags[2]))
            prefix = "/".join((backend, stage, *(n for n, on in named if on))) + "/d"
            sizes: dict[int, dict[int, float]] = {}
            for k, v in self.attention.items():
                size, _, length = k[len(prefix) :].partition("@t")
                if k.startswith(prefix) and size.isdigit() and (not length or length.isdigit()):
                    sizes.setdefault(int(size), {})[int(length or ATTENTION_PROBE_SEQ)] = v
            if sizes:
                near = min(sizes, key=lambda d: (abs(math.log2(d / head_dim)), d))
                return _by_length(sizes[near], seq or ATTENTION_PROBE_SEQ)
        return None


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    name: str  # canonical catalog id, e.g. "h200-sxm"
    full_name: str  # "NVIDIA H200 SXM 141GB"
    aliases: tuple[str, ...] = ()
    arch: str
    compute_capability: tuple[int, int]
    sm_count: int
    boost_clock_hz: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    l2_bytes: int
    # Dense (no 2:4 sparsity) peak rates in FLOP/s (OP/s for int8), by dtype key.
    tensor_core_flops: Mapping[str, float]
    cuda_core_flops: Mapping[str, float]
    # Elements a GEMM dimension must be a multiple of for the tensor-core fast path, by dtype.
    tc_align_elems: Mapping[str, int]
    sm_limits: SMLimits
    nvlink_bandwidth_bytes_per_s: float | None  # total, both directions; None: no NVLink
    pcie_bandwidth_bytes_per_s: float  # x16, total, both directions
    achievable: Achievable = field(default_factory=Achievable)
    sources: tuple[str, ...] = ()
    # Where numbers were replaced after the catalog: "driver" facts, a "profile" path.
    overridden: Mapping[str, str] = field(default_factory=lambda: _frozen({}))

    def __post_init__(self) -> None:
        for name in ("tensor_core_flops", "cuda_core_flops", "tc_align_elems", "overridden"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    # ---- rates -------------------------------------------------------------------------------
    def has_tensor_cores(self, dtype: Any) -> bool:
        return dtype_key(dtype) in self.tensor_core_flops

    def peak_flops(self, dtype: Any, tensor_cores: bool = True) -> float:
        """Datasheet dense peak in FLOP/s. fp32 with `tensor_cores=True` means TF32."""
        key = dtype_key(dtype)
        if tensor_cores:
            tc_key = "tf32" if key == "fp32" else key
            if tc_key in self.tensor_core_flops:
                return self.tensor_core_flops[tc_key]
        if key == "tf32":
            key = "fp32"
        if key in self.cuda_core_flops:
            return self.cuda_core_flops[key]
        if key in ("fp16", "bf16", "fp8", "int8"):  # no native path: runs at fp32 rate
            return self.cuda_core_flops["fp32"]
        raise ValueError(f"{self.name} has no {key} rate")

    def attainable_flops(self, dtype: Any, tensor_cores: bool = True) -> float:
        fraction = self.achievable.gemm(dtype_key(dtype)) if tensor_cores else 1.0
        return self.peak_flops(dtype, tensor_cores) * fraction

    def attainable_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_bytes_per_s * self.achievable.memory_bandwidth_fraction

    def ridge_point(self, dtype: Any = "bf16", tensor_cores: bool = True) -> float:
        """FLOP per byte above which a kernel is compute-bound (datasheet roofline)."""
        return self.peak_flops(dtype, tensor_cores) / self.memory_bandwidth_bytes_per_s

    def tc_alignment(self, dtype: Any) -> int | None:
        """Elements per GEMM dimension for the tensor-core fast path; None: no tensor cores."""
        return self.tc_align_elems.get(dtype_key(dtype))

    # ---- copies ------------------------------------------------------------------------------
    def replace(self, *, note: str | None = None, **changes: Any) -> GPUSpec:
        """A copy with fields changed; `note` records where the new numbers came from."""
        if note is not None:
            overridden = dict(self.overridden)
            overridden.update({k: note for k in changes})
            changes["overridden"] = overridden
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, Mapping):
                return {k: plain(v) for k, v in value.items()}
            if dataclasses.is_dataclass(value):
                return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            return value

        return plain(self)
