"""Work per op: FLOPs and minimum bytes, from an `OpRecord` alone.

Conventions (every formula file follows them):
- FLOPs count a multiply-add as 2 (FLOPs = 2 x MACs) for matmuls, convolutions and attention;
  other ops count one FLOP per arithmetic step per element, with per-element constants written
  in the formula's docstring. Transcendentals (exp, erf) count 1.
- Minimum bytes: every input read once and every output written once, nothing more (no
  re-reads, no spills, no caches). A broadcast (stride-0) input counts its stored elements once;
  the same tensor passed twice counts once; an in-place op reads and writes its target. Ops that
  overwrite a tensor without reading it (fill_, copy_, zero_, random draws, *_like factories)
  count the write only; gathers (embedding, index, gather) count the rows they touch, not the
  whole table.
- Views, detach and allocations cost nothing and launch nothing (`OpKind` "view"/"alloc").
- Ops with no formula: "pointwise"-tagged ops cost one FLOP per output element, "reduction"-tagged
  ops one per input element, anything else zero FLOPs; all move their minimum bytes.

`register_formula("aten.foo", ...)` adds a formula for an op packet ("aten.foo", every overload)
or one overload ("aten.foo.Tensor"); a project's own custom ops can register theirs the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from ..records import OpRecord, TensorMeta

GemmFamily = Literal["gemm", "conv", "attention"]


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """Which fused attention kernel runs a GEMM of family "attention": its measured rate
    (`Achievable.attention_rate`) depends on these and the head size."""

    backend: str  # "flash", "efficient", "cudnn"; "" for kernels gpushape has no rate for
    backward: bool
    dropout: bool
    causal: bool
    gqa: bool = False  # fewer K/V heads than query heads (grouped-query attention)


@dataclass(frozen=True, slots=True)
class Gemm:
    """One GEMM-shaped kernel inside an op: C[m, n] = A[m, k] @ B[k, n], `batch` times.

    `flops` is the useful work (2 x MACs; for causal attention only the unmasked part).
    `align_dims` are the (name, elements) pairs that must meet the tensor-core alignment:
    leading dimensions of GEMM operands, channels per group of a convolution.
    `tensor_cores` is False where the kernel cannot use them (depthwise convolution).
    """

    m: int
    n: int
    k: int
    flops: int
    family: GemmFamily = "gemm"
    batch: int = 1
    align_dims: tuple[tuple[str, int], ...] = ()
    tensor_cores: bool = True
    attention: AttentionKernel | None = None  # family "attention" only; k is the head size
    # family "conv" only: the kernel side of a patch embedding (stride equal to the kernel, no
    # padding or dilation: ViT's 16x16/16), whose rate on few input channels is measured apart
    patch: int = 0
    # family "conv" only: the largest stride of a convolution that is not a patch embedding
    # (0 for one that is, or a transposed one); on few input channels (a stem) its rate is
    # measured per stride (tracing/gemm_model.py `small_cin_rate`)
    stride: int = 0
    # family "conv" only: a key of the rates `gpushape probe` measured for a kernel of its own
    # (memory_efficiency), the rate this GEMM runs at over the model's (s2d-stem's convolution)
    rate_key: str = ""


@dataclass(frozen=True, slots=True)
class OpWork:
    """What one op must do: FLOPs, minimum bytes, its GEMMs, and kernels launched."""

    flops: int
    min_bytes: int
    gemms: tuple[Gemm, ...] = ()
    kernels: int = 1
    # Bytes the standard algorithm must move beyond min_bytes because it makes more than one
    # pass (BatchNorm in training: a statistics pass reads the input before the normalising
    # pass reads it again). Time counts them; min_bytes and intensity do not.
    reread_bytes: int = 0
    # Memory-bound kernels the op runs in sequence with its main one, (bytes moved, memory
    # family or None for the copy rate) each: a fused attention backward's dO . O row sums,
    # the zeroing and conversion of its float32 dQ. Time counts each on its own (added, not
    # overlapped with the main kernel); min_bytes and intensity do not.
    passes: tuple[tuple[int, str | None], ...] = ()

    @property
    def gemm_flops(self) -> int:
        return sum(g.flops for g in self.gemms)


Formula = Callable[[OpRecord], OpWork]
_FORMULAS: dict[str, Formula] = {}
NO_WORK = OpWork(flops=0, min_bytes=0, kernels=0)


def register_formula(*ops: str) -> Callable[[Formula], Formula]:
    """Register `fn(record) -> OpWork` for op packets ("aten.mm") or overloads ("aten.mm.out")."""

    def decorate(fn: Formula) -> Formula:
        for op in ops:
            _FORMULAS[op] = fn
        return fn

    return decorate


def packet(op: str) -> str:
    """'aten.add.Tensor' -> 'aten.add'."""
    return op.rsplit(".", 1)[0] if op.count(".") >= 2 else op


def op_work(rec: OpRecord) -> OpWork:
    """FLOPs and minimum bytes of one recorded op."""
    if rec.kind != "compute":
        return NO_WORK
    _load_formulas()
    formula = _FORMULAS.get(rec.op) or _FORMULAS.get(packet(rec.op))
    return formula(rec) if formula is not None else default_work(rec)


# ---- shared helpers -----------------------------------------------------------------------------
def unique_inputs(rec: OpRecord, skip: Iterable[str] = ()) -> list[TensorMeta]:
    skip = set(skip)
    return [
        t for name, t in zip(rec.input_names, rec.inputs) if t.same_as is None and name not in skip
    ]


def io_bytes(rec: OpRecord, skip: Iterable[str] = ()) -> int:
    """Every input (except `skip`) read once, every output written once."""
    read = sum(t.nbytes for t in unique_inputs(rec, skip))
    return read + sum(t.nbytes for t in rec.outputs)


def out_numel(rec: OpRecord) -> int:
    return rec.outputs[0].numel if rec.outputs else 0


def default_work(rec: OpRecord) -> OpWork:
    if "pointwise" in rec.tags:
        flops = out_numel(rec)
    elif "reduction" in rec.tags and rec.inputs:
        flops = rec.inputs[0].numel
    else:
        flops = 0
    return OpWork(flops=flops, min_bytes=io_bytes(rec))


_loaded = False


def _load_formulas() -> None:
    """Import the formula files once (each registers its ops)."""
    global _loaded
    if not _loaded:
        from . import attention, conv, matmul, memory, norm  # noqa: F401

        _loaded = True
