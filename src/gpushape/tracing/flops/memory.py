"""Pooling, embedding, gathers and scatters, copies and factories: mostly bytes, few FLOPs.

- max pool (with indices): output x taps comparisons; read input, write output (+ indices).
  Backward: one add per grad_output element; read grad_output + indices, write grad_input.
- avg pool: output x taps; read input, write output. Backward: the same FLOPs; read
  grad_output, write grad_input.
- adaptive avg pool: input + output (each input summed once, one divide per output).
  Backward: one divide per input element; read grad_output, write grad_input.
- embedding, index, index_select, gather: 0 FLOPs; read the indices and the selected rows,
  write the output. Embedding backward: one add per grad_output element; read grad_output and
  indices, write the whole table (its gradient is dense).
- scatter / scatter_add / index_put / index_add in place: one add per source element when they
  accumulate; read index + source, write (accumulating: read and write) the touched elements.
  Out of place, `self` is copied whole first.
- copy_, fill_, zero_, random draws, *_like / new_* / full / zeros / ones / arange: 0 FLOPs;
  write the output (copy_ also reads its source).
- clone, _to_copy, cat, stack, constant_pad_nd: 0 FLOPs; read inputs, write the output.
- roll: the same, once per rolled dimension (CUDA rolls one dimension a kernel).

The backward ops take the forward input (`self`) only for its shape: it is not read.
"""

from __future__ import annotations

import math

from ..records import OpRecord
from .registry import OpWork, io_bytes, out_numel, register_formula


def _taps(rec: OpRecord) -> int:
    return math.prod(rec.params.get("kernel_size", (1,)))


@register_formula(
    "aten.max_pool1d",
    "aten.max_pool2d",
    "aten.max_pool3d",
    "aten.max_pool2d_with_indices",
    "aten.max_pool3d_with_indices",
    "aten.avg_pool1d",
    "aten.avg_pool2d",
    "aten.avg_pool3d",
)
def pool(rec: OpRecord) -> OpWork:
    return OpWork(flops=out_numel(rec) * _taps(rec), min_bytes=io_bytes(rec))


@register_formula("aten.max_pool2d_with_indices_backward", "aten.max_pool3d_with_indices_backward")
def max_pool_backward(rec: OpRecord) -> OpWork:
    return OpWork(flops=rec.input("grad_output").numel, min_bytes=io_bytes(rec, skip=("self",)))


@register_formula("aten.avg_pool2d_backward", "aten.avg_pool3d_backward")
def avg_pool_backward(rec: OpRecord) -> OpWork:
    flops = rec.input("grad_output").numel * _taps(rec)
    return OpWork(flops=flops, min_bytes=io_bytes(rec, skip=("self",)))


@register_formula(
    "aten._adaptive_avg_pool2d",
    "aten._adaptive_avg_pool3d",
    "aten.adaptive_max_pool2d",
    "aten.adaptive_max_pool3d",
)
def adaptive_pool(rec: OpRecord) -> OpWork:
    return OpWork(flops=rec.inputs[0].numel + out_numel(rec), min_bytes=io_bytes(rec))


@register_formula(
    "aten._adaptive_avg_pool2d_backward",
    "aten._adaptive_avg_pool3d_backward",
    "aten.adaptive_max_pool2d_backward",
    "aten.adaptive_max_pool3d_backward",
)
def adaptive_pool_backward(rec: OpRecord) -> OpWork:
    return OpWork(flops=out_numel(rec), min_bytes=io_bytes(rec, skip=("self",)))


def _gather_bytes(rec: OpRecord, table: str) -> int:
    """Index tensors read, one selected element read per output element, output written."""
    out = rec.outputs[0]
    indices = sum(
        t.nbytes for n, t in zip(rec.input_names, rec.inputs) if n != table and t.same_as is None
    )
    return indices + out.numel * rec.input(table).itemsize + out.nbytes


@register_formula("aten.embedding")
def embedding(rec: OpRecord) -> OpWork:
    return OpWork(flops=0, min_bytes=_gather_bytes(rec, "weight"))


@register_formula(
    "aten.index", "aten._unsafe_index", "aten.index_select", "aten.gather", "aten.take"
)
def gather(rec: OpRecord) -> OpWork:
    return OpWork(flops=0, min_bytes=_gather_bytes(rec, "self"))


@register_formula("aten.embedding_dense_backward", "aten.embedding_backward")
def embedding_backward(rec: OpRecord) -> OpWork:
    return OpWork(flops=rec.input("grad_output").numel, min_bytes=io_bytes(rec))


_ACCUMULATING = ("scatter_add", "scatter_reduce", "index_add", "index_reduce")


def _source(rec: OpRecord):
    for name in ("src", "source", "values"):
        if rec.has_input(name):
            return rec.input(name)
    return None


@register_formula(
    "aten.scatter",
    "aten.scatter_",
    "aten.scatter_add",
    "aten.scatter_add_",
    "aten.scatter_reduce",
    "aten.scatter_reduce_",
    "aten.index_add",
    "aten.index_add_",
    "aten.index_put",
    "aten.index_put_",
    "aten._index_put_impl_",
    "aten.index_copy",
    "aten.index_copy_",
)
def scatter(rec: OpRecord) -> OpWork:
    src = _source(rec)
    accumulate = rec.name.rstrip("_") in _ACCUMULATING or bool(rec.params.get("accumulate"))
    touched = src.numel if src is not None else rec.input("index").numel
    flops = touched if accumulate else 0
    if not rec.inplace:  # out of place: self is copied whole into the output first
        return OpWork(flops=flops, min_bytes=io_bytes(rec))
    itemsize = rec.input("self").itemsize
    reads = sum(
        t.nbytes for n, t in zip(rec.input_names, rec.inputs) if n != "self" and t.same_as is None
    )
    rmw = touched * itemsize * (2 if accumulate else 1)  # read-modify-write when accumulating
    return OpWork(flops=flops, min_bytes=reads + rmw)


@register_formula(
    "aten.copy_",
    "aten.fill_",
    "aten.zero_",
    "aten.normal_",
    "aten.uniform_",
    "aten.random_",
    "aten.bernoulli_",
    "aten.exponential_",
    "aten.cauchy_",
    "aten.log_normal_",
    "aten.geometric_",
)
def overwrite(rec: OpRecord) -> OpWork:
    """The target is written, not read; copy_ and bernoulli_(p: Tensor) read their source."""
    return OpWork(flops=0, min_bytes=io_bytes(rec, skip=("self",)))


@register_formula(
    "aten.zeros_like",
    "aten.ones_like",
    "aten.full_like",
    "aten.rand_like",
    "aten.randn_like",
    "aten.randint_like",
    "aten.new_zeros",
    "aten.new_ones",
    "aten.new_full",
    "aten.zeros",
    "aten.ones",
    "aten.full",
    "aten.arange",
    "aten.scalar_tensor",
    "aten.rand",
    "aten.randn",
    "aten.randint",
    "aten.randperm",
    "aten.linspace",
    "aten.eye",
)
def factory(rec: OpRecord) -> OpWork:
    return OpWork(flops=0, min_bytes=sum(t.nbytes for t in rec.outputs))


@register_formula(
    "aten.clone",
    "aten._to_copy",
    "aten.cat",
    "aten.stack",
    "aten.constant_pad_nd",
    "aten.lift_fresh_copy",
    "aten.repeat",
    "aten.flip",
)
def copy(rec: OpRecord) -> OpWork:
    return OpWork(flops=0, min_bytes=io_bytes(rec))


@register_formula("aten.roll")
def roll(rec: OpRecord) -> OpWork:
    """PyTorch's CUDA roll moves one dimension a kernel: rolling k dimensions (Swin's shifted
    windows roll two) copies the tensor k times, the k - 1 more passes as re-read bytes."""
    passes = max(len(rec.params.get("dims") or ()), 1)
    nbytes = io_bytes(rec)
    return OpWork(flops=0, min_bytes=nbytes, kernels=passes, reread_bytes=(passes - 1) * nbytes)
