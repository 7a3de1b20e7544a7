"""`cost(trace, gpu, math=None) -> CostReport`: every op on the roofline of one GPU.

Per op (FLOPs and minimum bytes from `flops.py`):
    compute_s = sum over its GEMMs of flops / (attainable tensor-core FLOP/s x GEMM efficiency)
                + gpu.achievable.gemm_latency_s per matrix product or convolution (one
                  kernel each: its pipeline's fill, epilogue and tail, `gemm_model.py`)
                + the rest of its FLOPs / CUDA-core FLOP/s of its dtype
    memory_s  = (min_bytes + reread_bytes) / (gpu.attainable_bandwidth_bytes_per_s() x
                                              efficiency of the op's memory family)
                (reread_bytes: the second pass of two-pass algorithms such as BatchNorm in
                training, whose statistics must be complete before any output is written;
                the family efficiency: what eager kernels of its kind reach against the copy
                rate, measured by `gpushape probe`, 1 where unmeasured: `families.py`),
                and no less than gpu.achievable.kernel_floor_s per kernel other than a
                matrix product's (the shortest a kernel runs: `probe/memory.py`)
    layout_s        = an NCHW convolution on tensor cores: cuDNN's NHWC conversions' bytes
                      (`layout.py`) / (copy rate x the profile's "nchw_conversion" efficiency,
                      a patch embedding's by its side: `layout.conversion_family`);
                      a LayerNorm or softmax given a non-contiguous input: the copy its kernel
                      first makes (`layout.hidden_copies`) at its copy family's efficiency
    weight_grad_s   = a LayerNorm backward whose weight gradients PyTorch sums with one block
                      per 32 columns (`norm_grads.py`): that kernel's time; its bytes leave
                      memory_s. A convolution backward's bias gradient: grad_output read once
                      more by a kernel of its own, priced as a sum of its rows into its channels
                      (`flops/conv.py bias_grad_pass`, `sums.py`; ConvNeXt-T's depthwise
                      convs have biases)
    passes_s        = kernels an op runs beside its main one, each (bytes, family) at its
                      family's rate and no less than the floor: a fused attention backward's
                      dO . O row sums, dQ's float32 zeroing and conversion (`flops/attention.py`)
    kernel_time_s   = max(compute_s, memory_s) + layout_s + weight_grad_s + passes_s
    launch_s        = kernels x gpu.achievable.launch_overhead_s   (conversions: 2 a pass,
                                                                  hidden copies: 1 each)
    roofline_time_s = kernel_time_s + launch_s          # serial: launch not hidden
Views, detach and allocations cost nothing and launch nothing. `bound` says which side of the
roofline the op sits on ("compute" or "memory"; "none" for ops that do no work).

Math mode (`math`): the rate GEMM-class ops (matmul, convolution, attention) run at.
- None: each op's own dtype. fp16/bf16 run on tensor cores; fp32 matmuls run on CUDA cores
  (PyTorch's default `torch.backends.cuda.matmul.allow_tf32 = False`), fp32 convolutions on TF32
  tensor cores (cuDNN's default `torch.backends.cudnn.allow_tf32 = True`).
- "tf32": fp32 matmuls and convolutions on TF32 tensor cores.
- "fp32": fp32 on CUDA cores everywhere.
- "bf16"/"fp16": GEMM-class ops at that rate whatever the tensors' dtype (as under autocast);
  bytes still come from the traced dtypes.
Tensor cores apply where the GPU has them for the math dtype and the kernel can use them
(not a depthwise convolution); a dimension missing `gpu.tc_alignment(dtype)` lowers the GEMM
efficiency (`gemm_model.py`). Non-GEMM FLOPs run at the CUDA-core rate of the op's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..errors import GpushapeError
from ..hardware import GPUSpec, dtype_key, get_gpu
from .copies import copy_family
from .families import op_family, priced_family, sum_family
from .flops.conv import bias_grad_pass
from .flops.registry import OpWork, op_work
from .gemm_model import LATENCY_FAMILIES, GemmEfficiency, gemm_efficiency
from .layout import conversion_bytes_of, conversion_family, conversion_passes, hidden_copies
from .norm_grads import weight_grad_cost
from .records import OpRecord, Trace
from .sums import CHANNEL_SUM, COLUMN_SUM

MathMode = Literal["bf16", "fp16", "fp32", "tf32"]
MATH_MODES = ("bf16", "fp16", "fp32", "tf32")
Bound = Literal["compute", "memory", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpCost:
    """One op's cost on one GPU. Times in seconds, FLOPs as 2 x MACs for GEMM-class ops."""

    index: int
    op: str
    module: str
    module_type: str
    phase: str
    flops: int
    min_bytes: int
    intensity: float  # FLOPs per minimum byte (0 when no bytes move)
    bound: Bound
    compute_s: float
    memory_s: float
    kernel_time_s: float
    launch_s: float
    roofline_time_s: float
    kernels: int
    math: str  # dtype key whose rate the op's FLOPs ran at: "bf16", "tf32", "fp32"...
    tensor_cores: bool
    efficiency: float  # GEMM efficiency (FLOP-weighted over the op's GEMMs); 1.0 otherwise
    gemm_flops: int  # FLOPs of the op's GEMMs (the tensor-core work; 2 x MACs)
    gemms: tuple[GemmEfficiency, ...] = ()
    misaligned: tuple[str, ...] = ()  # "K=4095": dimensions missing the tensor-core alignment
    # layout conversions inside the op (in kernel_s): an NCHW tensor-core convolution's, the
    # contiguous copy a LayerNorm or softmax makes of a permuted input
    layout_s: float = 0.0
    # a LayerNorm backward's weight gradients summed one block per 32 columns (in kernel_s)
    weight_grad_s: float = 0.0
    # memory-bound kernels the op runs beside its main one (flops/registry.py OpWork.passes: a
    # fused attention backward's row sums and dQ conversion; in kernel_s)
    passes_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CostTotals:
    """Sums over a set of ops."""

    flops: int = 0
    min_bytes: int = 0
    gemm_flops: int = 0
    kernel_time_s: float = 0.0
    launch_s: float = 0.0
    roofline_time_s: float = 0.0
    compute_bound_s: float = 0.0  # roofline time of the compute-bound ops among them
    kernels: int = 0
    ops: int = 0  # ops that do work (views and allocations not counted)

    def __add__(self, other: CostTotals) -> CostTotals:
        return CostTotals(*(a + b for a, b in zip(self._values(), other._values())))

    def _values(self) -> tuple:
        return (
            self.flops,
            self.min_bytes,
            self.gemm_flops,
            self.kernel_time_s,
            self.launch_s,
            self.roofline_time_s,
            self.compute_bound_s,
            self.kernels,
            self.ops,
        )

    @property
    def intensity(self) -> float:
        return self.flops / self.min_bytes if self.min_bytes else 0.0

    @property
    def bound(self) -> Bound:
        if self.roofline_time_s <= 0:
            return "none"
        return "compute" if self.compute_bound_s >= self.roofline_time_s / 2 else "memory"

    @classmethod
    def of(cls, ops: Iterable[OpCost]) -> CostTotals:
        total = cls()
        for op in ops:
            if op.bound == "none":
                continue
            total = total + cls(
                op.flops,
                op.min_bytes,
                op.gemm_flops,
                op.kernel_time_s,
                op.launch_s,
                op.roofline_time_s,
                op.roofline_time_s if op.bound == "compute" else 0.0,
                op.kernels,
                1,
            )
        return total


@dataclass(frozen=True, slots=True)
class ModuleCost:
    """A module's cost, forward and backward apart."""

    module: str
    module_type: str
    forward: CostTotals
    backward: CostTotals

    @property
    def total(self) -> CostTotals:
        return self.forward + self.backward


@dataclass(kw_only=True)
class CostReport:
    """Per-op costs of a trace on one GPU, with per-module and whole-model sums."""

    model: str
    gpu: GPUSpec
    math: str | None
    train: bool
    ops: list[OpCost]
    modules: dict[str, str] = field(default_factory=dict)  # module path -> type, tree order

    @property
    def totals(self) -> CostTotals:
        return CostTotals.of(self.ops)

    @property
    def forward(self) -> CostTotals:
        return CostTotals.of(op for op in self.ops if op.phase == "forward")

    @property
    def backward(self) -> CostTotals:
        return CostTotals.of(op for op in self.ops if op.phase == "backward")

    def by_module(self, *, inclusive: bool = False) -> dict[str, ModuleCost]:
        """Costs per module path. inclusive=False: the ops attributed to the module itself
        (its own functional code, or a leaf's op); inclusive=True: with all submodules."""
        groups: dict[str, list[OpCost]] = {path: [] for path in self.modules}
        for op in self.ops:
            paths = _ancestors(op.module) if inclusive else (op.module,)
            for path in paths:
                groups.setdefault(path, []).append(op)
        return {
            path: ModuleCost(
                path,
                self.modules.get(path) or (ops[0].module_type if ops else ""),
                CostTotals.of(o for o in ops if o.phase == "forward"),
                CostTotals.of(o for o in ops if o.phase == "backward"),
            )
            for path, ops in groups.items()
            if ops
        }

    def top_ops(self, n: int = 10) -> list[OpCost]:
        return sorted(self.ops, key=lambda o: o.roofline_time_s, reverse=True)[:n]


def _ancestors(path: str) -> tuple[str, ...]:
    """'a.b.c' -> ('', 'a', 'a.b', 'a.b.c')."""
    if not path:
        return ("",)
    parts = path.split(".")
    return ("", *(".".join(parts[:i]) for i in range(1, len(parts) + 1)))


def cost(trace: Trace, gpu: GPUSpec | str, *, math: MathMode | None = None) -> CostReport:
    """Cost every op of `trace` on `gpu` (a GPUSpec or a catalog name) in math mode `math`."""
    spec = get_gpu(gpu)
    if math is not None and math not in MATH_MODES:
        raise GpushapeError(f"unknown math mode {math!r}; known: {', '.join(MATH_MODES)}")
    ops = [op_cost(rec, spec, math) for rec in trace.ops]
    return CostReport(
        model=trace.model,
        gpu=spec,
        math=math,
        train=trace.train,
        ops=ops,
        modules=dict(trace.modules),
    )


def _tensor_dtype(rec: OpRecord) -> str:
    """The dtype key of the op's first floating-point tensor ("fp32" if none)."""
    for t in (*rec.inputs, *rec.outputs):
        if t.is_floating:
            try:
                return dtype_key(t.dtype)
            except ValueError:
                continue
    return "fp32"


def _gemm_math(dtype: str, math: str | None, family: str) -> str:
    """The dtype key GEMM-class work runs at (see the module docstring)."""
    if math is None:
        return "tf32" if dtype == "fp32" and family == "conv" else dtype
    if math == "tf32":
        return "tf32" if dtype == "fp32" else dtype
    if math == "fp32":
        return dtype
    return math


def hidden_copy_families(
    rec: OpRecord, measured: Mapping[str, float]
) -> tuple[tuple[int, str | None], ...]:
    """(bytes, priced family) of each copy `rec`'s kernel makes of a non-contiguous input
    (`layout.hidden_copies`): read once, written once, at its copy family's measured rate (or
    the one it falls back to), else at a clone's (elementwise)."""
    out = []
    for t, kind in hidden_copies(rec):
        family = priced_family(copy_family(t, kind), measured)
        out.append((2 * t.numel * t.itemsize, family if family in measured else "elementwise"))
    return tuple(out)


def hidden_copy_seconds(rec: OpRecord, gpu: GPUSpec) -> list[float]:
    """Each copy `rec`'s kernel makes first (`layout.hidden_copies`, in its order): its bytes at
    its copy family's measured rate (`hidden_copy_families`), at least a kernel."""
    bandwidth = gpu.attainable_bandwidth_bytes_per_s()
    return [
        max(nbytes / (bandwidth * gpu.achievable.memory(family)), gpu.achievable.kernel_floor_s)
        for nbytes, family in hidden_copy_families(rec, gpu.achievable.memory_efficiency)
    ]


def op_cost(
    rec: OpRecord, gpu: GPUSpec, math: str | None = None, work: OpWork | None = None
) -> OpCost:
    """One op on `gpu`: the roofline above."""
    work = work if work is not None else op_work(rec)
    dtype = _tensor_dtype(rec)
    effs: list[GemmEfficiency] = []
    compute_s, gemm_flops, math_key, used_tc = 0.0, 0, dtype, False
    for g in work.gemms:
        key = _gemm_math(dtype, math, g.family)
        tc = g.tensor_cores and gpu.has_tensor_cores(key)
        eff = gemm_efficiency(g, gpu, key, tensor_cores=tc)
        compute_s += g.flops / (gpu.attainable_flops(key, tensor_cores=tc) * eff.efficiency)
        if g.family in LATENCY_FAMILIES:  # one kernel's fill, epilogue and tail
            compute_s += gpu.achievable.gemm_latency_s
        effs.append(eff)
        gemm_flops += g.flops
        math_key, used_tc = key, used_tc or tc
    rest = max(work.flops - gemm_flops, 0)
    compute_s += rest / gpu.attainable_flops(dtype, tensor_cores=False)
    measured = gpu.achievable.memory_efficiency
    bandwidth = gpu.attainable_bandwidth_bytes_per_s()
    columns_bytes, weight_grad_s = weight_grad_cost(rec, gpu)
    memory_s = (work.min_bytes + work.reread_bytes - columns_bytes) / (
        bandwidth * gpu.achievable.memory(op_family(rec, measured))
    )
    floor = gpu.achievable.kernel_floor_s  # each kernel but the matrix products'
    passes_s = sum(  # kernels of their own beside the main one, each at its family's rate
        max(nbytes / (bandwidth * gpu.achievable.memory(family)), floor)
        for nbytes, family in work.passes
    )
    memory_s = max(memory_s, max(work.kernels - len(work.gemms) - len(work.passes), 0) * floor)
    kernel_s = max(compute_s, memory_s)
    kernels = work.kernels
    layout_s = 0.0
    passes = conversion_passes(rec) if used_tc else 0
    if passes:  # cuDNN's NHWC conversions: kernels of their own, after and before the GEMM
        layout_s = max(
            conversion_bytes_of(rec)
            / (bandwidth * gpu.achievable.memory(conversion_family(rec, measured))),
            2 * passes * floor,
        )
        kernels += 2 * passes
    for copy_s in hidden_copy_seconds(rec, gpu):  # a copy kernel before the op
        layout_s += copy_s
        kernels += 1
    bias = bias_grad_pass(rec)  # a convolution's bias gradient: a column sum of its own
    if bias is not None:  # (its kernel is counted in `work.kernels`, so under the floor too)
        nbytes, rows, channels, nhwc = bias
        family = sum_family(COLUMN_SUM if nhwc else CHANNEL_SUM, measured, rows, channels)
        weight_grad_s += nbytes / (bandwidth * gpu.achievable.memory(family))
    kernel_s += layout_s + weight_grad_s + passes_s
    launch_s = kernels * gpu.achievable.launch_overhead_s
    if work.flops == 0 and work.min_bytes == 0 and work.kernels == 0:
        bound: Bound = "none"
    else:
        bound = "compute" if compute_s > memory_s else "memory"
    efficiency = 1.0
    if effs and gemm_flops:
        efficiency = gemm_flops / sum(e.gemm.flops / e.efficiency for e in effs)
    return OpCost(
        index=rec.index,
        op=rec.op,
        module=rec.module,
        module_type=rec.module_type,
        phase=rec.phase,
        flops=work.flops,
        min_bytes=work.min_bytes,
        intensity=work.flops / work.min_bytes if work.min_bytes else 0.0,
        bound=bound,
        compute_s=compute_s,
        memory_s=memory_s,
        kernel_time_s=kernel_s,
        launch_s=launch_s,
        roofline_time_s=kernel_s + launch_s,
        kernels=kernels,
        math=math_key,
        tensor_cores=used_tc,
        efficiency=efficiency,
        gemm_flops=gemm_flops,
        gemms=tuple(effs),
        misaligned=tuple(m for e in effs for m in e.misaligned),
        layout_s=layout_s,
        weight_grad_s=weight_grad_s,
        passes_s=passes_s,
    )
