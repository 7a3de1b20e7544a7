"""What Inductor's fusion takes off a training step's GPU time: the memory traffic between the
eager kernels it fuses.

Inductor keeps the extern kernels (cuBLAS GEMMs, cuDNN convolutions, fused attention) and
generates the rest: the ops between two extern kernels of one phase (a "run", as
pricing/inductor_kernels.py counts kernels) become a few Triton kernels that read each tensor
coming from outside the run once and write only the tensors something outside the run reads
(the next extern kernel, a later run, the backward) or nobody in the step does (the loss, the
weights' gradients). A tensor one op of the run writes and only others of the run read never
reaches memory.

So each op of a run keeps the share of its eager time that its outside traffic is of its
bytes: its inputs from outside the run (each tensor counted at its first reader in the run),
its outputs read outside the run or never read. The rest is the saving. Each op keeps its own
family's rate: a reduction stays as fast or slow as its family measured. Tensors are told
apart by their storage (records.TensorMeta.storage): a view reads what its base holds, and a
tensor from outside read twice through views that start at the same place is read once;
views that start elsewhere (the two halves of a fused gate/up projection's output) are
different data, each read.

A kernel that copies between layouts reads or writes across its rows, and Inductor's kernel
that fuses such a copy with the op reading it runs at that pace: the op reading a transposed
or permuted copy made in its run keeps its outside traffic at the copy family's rate, not its
own. GPT-2 compiled on the H200 gathers each layer's query, key and value gradients (cuDNN's
(B, H, T, D) layout) into c_attn's (B, T, 3C) gradient in one Triton kernel: 92 us a layer,
against 18 us for its bytes at the copy rate (loops-h200-5,
`triton_poi_fused__unsafe_view_add_cat_clone_transpose_view`). Its copies read as permuted, a
family measured at 0.30 of the copy rate: priced so, about 60 us (32 before).

Measured on the H200 (benchmarks/steps/check_compiled_gpu.py): a LLaMA-style decoder written
as Hugging Face writes it (RMSNorm and the rotary embedding as chains of small ops) ran its
compiled step's kernels in 18.2 ms where the eager kernels were priced at 28.0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ...tracing.families import COPY_FAMILIES, op_family
from ...tracing.layout import copy_op_kind
from .inductor_kernels import is_extern


def runs(trace: Any, cost: Any) -> list[list[Any]]:
    """The runs of compute ops between extern kernels, per phase, in trace order."""
    by_index = {c.index: c for c in cost.ops}
    out: list[list[Any]] = []
    for phase in ("forward", "backward"):
        run: list[Any] = []
        for rec in trace.ops:
            if rec.phase != phase or rec.kind != "compute":
                continue
            if is_extern(rec, by_index.get(rec.index)):  # an extern kernel closes the run
                if run:
                    out.append(run)
                run = []
                continue
            run.append(rec)
        if run:
            out.append(run)
    return out


def _readers(trace: Any) -> dict[int, list[int]]:
    """storage -> the compute ops reading it, by trace index."""
    readers: dict[int, list[int]] = defaultdict(list)
    for rec in trace.ops:
        if rec.kind != "compute":
            continue
        for t in rec.inputs:
            if t.storage is not None and t.same_as is None:
                readers[t.storage].append(rec.index)
    return readers


def outside_share(run: list[Any], readers: dict[int, list[int]]) -> dict[int, float]:
    """Per op of the run (by trace index): the share of its bytes that cross the run's edge."""
    members = {r.index for r in run}
    written: set[int] = set()
    read: set[tuple[int, int | None]] = set()  # (storage, offset): a view's start in it
    shares: dict[int, float] = {}
    for rec in run:
        total = outside = 0
        for t in rec.inputs:
            if t.same_as is not None:
                continue
            total += t.nbytes
            seen = (t.storage, t.offset)
            if t.storage is None or (t.storage not in written and seen not in read):
                outside += t.nbytes
            if t.storage is not None:
                read.add(seen)
        for t in rec.outputs:
            total += t.nbytes
            later = readers.get(t.storage, ()) if t.storage is not None else ()
            if t.storage is None or not later or any(i not in members for i in later):
                outside += t.nbytes
            if t.storage is not None:
                written.add(t.storage)
        shares[rec.index] = outside / total if total else 1.0
    return shares


def has_storages(trace: Any) -> bool:
    """Whether the trace numbered its tensors' storages (a meta trace does; one on a real
    device, or one saved before storages were recorded, does not)."""
    return any(t.storage is not None for r in trace.ops for t in r.outputs)


def compiled_fusion_saving_s(ctx: Any, exclude: Iterable[int] = ()) -> float:
    """GPU seconds the traced eager step's fused ops cost beyond Inductor's kernels (module
    docstring); ops in `exclude` (trace indices: ones priced by their own compiled model, as
    the cross-entropy's) are left as they are."""
    if not has_storages(ctx.trace):
        return 0.0  # no dataflow to follow
    skip = set(exclude)
    readers = _readers(ctx.trace)
    records = {r.index: r for r in ctx.trace.ops}
    saving = 0.0
    for run in runs(ctx.trace, ctx.cost):
        slowed = copy_paced(run, ctx.gpu.achievable)
        for index, share in outside_share(run, readers).items():
            if index in skip or (share >= 1.0 and index not in slowed):
                continue
            eager = ctx.op_cost(records[index]).kernel_time_s
            saving += eager - eager * share * slowed.get(index, 1.0)
    return saving


def copy_paced(run: list[Any], achievable: Any) -> dict[int, float]:
    """Ops of the run that read a transposed or permuted copy made in the run: trace index ->
    how much slower the copy family's rate is than the op's own (> 1 only)."""
    measured = achievable.memory_efficiency
    made: dict[int, str] = {}  # storage -> the copy family of the copy that wrote it
    out: dict[int, float] = {}
    for rec in run:
        slow = [made[t.storage] for t in rec.inputs if t.storage in made]
        if slow:
            own = achievable.memory(op_family(rec, measured))
            pace = min(achievable.memory(f) for f in slow)
            if 0 < pace < own:
                out[rec.index] = own / pace
        kind = copy_op_kind(rec)
        if kind is not None and COPY_FAMILIES[kind] in measured:
            for t in rec.outputs:
                if t.storage is not None:
                    made[t.storage] = COPY_FAMILIES[kind]
    return out
