"""Price "pad this dimension to the tensor-core granularity" with the cost model.

A misaligned dimension value `v` (a Linear's N, a convolution's input channels per group) is
replaced by `padded` in every tensor of the forward op and of the backward ops autograd ran for
it, along the axes where that dimension lives:
- matrix products (and the sums of a Linear's bias gradient): the last two dimensions;
- convolutions: the channel axis of activations and gradients (groups x channels per group),
  both channel axes of the weight, the bias.
Only axes holding exactly `v` change, so spatial sizes and batch dimensions stay. A token
count that happens to equal `v` is padded too; that costs the padded version a little, so
the estimate stays on the safe side.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...tracing.records import OpRecord, TensorMeta
from ..patterns import CONV_OPS
from .synth import map_tensors, resized

CONV_BACKWARD_OPS = frozenset({"convolution_backward", "convolution_backward_overrideable"})


def is_conv(rec: OpRecord) -> bool:
    return rec.name in CONV_OPS or rec.name in CONV_BACKWARD_OPS


def parse_misaligned(text: str) -> tuple[str, int] | None:
    """'K=4095' -> ('K', 4095); strided leading dimensions ('ld(K)=...') -> None: padding the
    dimension does not align a view's stride (a contiguous copy does)."""
    name, sep, value = text.rpartition("=")
    if not sep or name.startswith("ld(") or not value.isdigit():
        return None
    return name, int(value)


def _pad_axes(t: TensorMeta, axes: Sequence[int], value: int, padded: int) -> TensorMeta:
    shape = list(t.shape)
    changed = False
    for axis in axes:
        if -len(shape) <= axis < len(shape) and shape[axis] == value:
            shape[axis] = padded
            changed = True
    return resized(t, shape) if changed else t


def _weight_shape(rec: OpRecord) -> tuple[int, ...] | None:
    return rec.input("weight").shape if rec.has_input("weight") else None


def pad_conv(rec: OpRecord, per_group: int, padded: int) -> OpRecord:
    groups = int(rec.params.get("groups", 1))
    weight = _weight_shape(rec)

    def pad(name: str, t: TensorMeta) -> TensorMeta:
        if weight is not None and t.shape == weight:  # weight, grad_weight: (Cout, Cin/g, *k)
            t = _pad_axes(t, (1,), per_group, padded)
            return _pad_axes(t, (0,), per_group * groups, padded * groups)
        if len(t.shape) == 1:  # bias, grad_bias: (Cout,)
            return _pad_axes(t, (0,), per_group * groups, padded * groups)
        if len(t.shape) >= 3:  # activations and their gradients: (N, C, *spatial)
            return _pad_axes(t, (1,), per_group * groups, padded * groups)
        return t

    return map_tensors(rec, pad)


def pad_matmul(rec: OpRecord, value: int, padded: int) -> OpRecord:
    return map_tensors(rec, lambda name, t: _pad_axes(t, (-2, -1), value, padded))


def pad_records(recs: Sequence[OpRecord], value: int, padded: int) -> list[OpRecord]:
    """The records with dimension `value` padded to `padded` (see the module docstring)."""
    return [
        pad_conv(r, value, padded) if is_conv(r) else pad_matmul(r, value, padded) for r in recs
    ]
