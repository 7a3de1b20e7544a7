"""Records of ops that were not traced: the same op with other shapes, or the op a fix would
run instead. Rules cost them with the trace's own cost model (`AuditContext.price`, through
`trace.cost.op_cost`), so a what-if is priced exactly as the traced op is."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...tracing.recorder import op_tags
from ...tracing.records import DTYPE_BYTES, OpRecord, TensorMeta


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def tensor(shape: Sequence[int], dtype: str) -> TensorMeta:
    """A contiguous tensor of `shape` and `dtype` ("bfloat16", ...)."""
    shape = tuple(int(n) for n in shape)
    return TensorMeta(
        shape=shape,
        dtype=dtype,
        strides=contiguous_strides(shape),
        memory_format="contiguous",
        itemsize=DTYPE_BYTES.get(dtype, 4),
    )


def resized(t: TensorMeta, shape: Sequence[int]) -> TensorMeta:
    """`t` with a new shape and the same layout: dimensions keep their order in memory
    (a transposed view stays transposed, channels_last stays channels_last); broadcast
    (stride 0) dimensions stay broadcast."""
    shape = tuple(int(n) for n in shape)
    if len(shape) != len(t.shape) or len(t.strides) != len(t.shape):
        return dataclasses.replace(t, shape=shape, strides=contiguous_strides(shape))
    order = sorted(range(len(shape)), key=lambda d: (t.strides[d], -d))  # innermost first
    strides = [0] * len(shape)
    step = 1
    for d in order:
        if t.strides[d] == 0:
            continue
        strides[d] = step
        step *= max(shape[d], 1)
    return dataclasses.replace(t, shape=shape, strides=tuple(strides))


def map_tensors(rec: OpRecord, fn: Callable[[str, TensorMeta], TensorMeta]) -> OpRecord:
    """`rec` with every input (by name) and output (named "out[i]") passed through `fn`."""
    inputs = tuple(fn(name, t) for name, t in zip(rec.input_names, rec.inputs))
    outputs = tuple(fn(f"out[{i}]", t) for i, t in enumerate(rec.outputs))
    return dataclasses.replace(rec, inputs=inputs, outputs=outputs)


def record(
    op: str,
    inputs: Mapping[str, TensorMeta],
    outputs: Sequence[TensorMeta],
    *,
    params: Mapping[str, Any] | None = None,
    like: OpRecord | None = None,
    phase: str = "forward",
) -> OpRecord:
    """A new op record (module and phase taken from `like` when given), with the tags the
    tracer gives `op` ("reduction" for a sum...), so that it is priced in the same memory
    family as a traced one."""
    return OpRecord(
        index=like.index if like else -1,
        op=op,
        module=like.module if like else "",
        module_type=like.module_type if like else "",
        phase=like.phase if like else phase,
        kind="compute",
        inputs=tuple(inputs.values()),
        input_names=tuple(inputs),
        outputs=tuple(outputs),
        params=dict(params or {}),
        tags=op_tags(op),
    )
