"""Sums down to one value a channel: their shape, and the measured rate nearest it.

A training step takes many: a Linear's bias gradient is the column sum of its output gradient
(`grad.sum(0)` over every token), a channels_last convolution's bias gradient the same, and in
NCHW a convolution's bias gradient or a layer scale's gradient sums each channel over batch and
positions (`x.sum((0, 2, 3))`). PyTorch's reduction kernel picks its launch from both the rows
it sums and the channels it keeps, and its rate follows both: on an H100, ConvNeXt-T's
50176 x 192 sums (its second stage at batch 64) ran at about 200 GB/s and its 200704 x 384 ones
at 1,300 GB/s (benchmarks/results/correlate-h100/correlate-ops.json).

Two families price them (tracing/families.py): "reduction", the column sums (the kept channel
is the last dimension), and "channel_sum", the NCHW ones (a middle dimension kept), which falls
back to "reduction" where unmeasured. The probe measured column sums by width alone,
"reduction@<width>" at 16384 rows; `benchmarks/kernels/probe_column_sums.py` measures both
families over rows and channels, "<family>@<rows>x<channels>", and where a profile has such a
grid a sum is priced at the grid point nearest its own shape (by ratio, both sizes alike:
`grid_key`). Without one the width alone decides, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .records import OpRecord

COLUMN_SUM = "reduction"
CHANNEL_SUM = "channel_sum"
GEMV_SUM = "gemv_column_sum"  # the same column sum by cuBLAS's GEMV (steps/graph_layers_gemv.py)
WIDTH_ROWS = 16384  # the rows "reduction@<width>" was measured at
BASE_SHAPE = (65536, 1024)  # the sum the "reduction" figure itself was measured on


def column_width(rec: OpRecord) -> int | None:
    """A column sum's width: the columns a reduction keeps where it sums every leading
    dimension of its input and keeps the last (a bias gradient); None for other reductions."""
    first = rec.inputs[0] if rec.inputs else None
    out = rec.outputs[0] if rec.outputs else None
    if first is None or out is None or len(first.shape) < 2:
        return None
    width, rank = int(first.shape[-1]), len(first.shape)
    dims = _dims(rec)
    if (rank - 1) in {d % rank for d in dims}:
        return None  # the last dimension is summed: a row sum (a square input's too)
    return width if out.numel == width and first.numel > width else None


def row_length(rec: OpRecord) -> int | None:
    """The length of the rows a norm or softmax works on: its input's last dimension."""
    first = rec.inputs[0] if rec.inputs else None
    return int(first.shape[-1]) if first is not None and first.shape else None


def channel_dim(rec: OpRecord) -> int | None:
    """The one dimension, not the last, that a reduction keeps while summing all others (an
    NCHW per-channel sum over `(0, 2, 3)`); None for any other reduction."""
    first = rec.inputs[0] if rec.inputs else None
    out = rec.outputs[0] if rec.outputs else None
    dims = _dims(rec)
    if first is None or out is None or len(first.shape) < 3 or not dims:
        return None
    rank = len(first.shape)
    kept = [d for d in range(rank) if d not in {d % rank for d in dims}]
    if len(kept) != 1 or kept[0] == rank - 1:
        return None
    channels = int(first.shape[kept[0]])
    return kept[0] if channels > 1 and out.numel == channels < first.numel else None


def sum_shape(rec: OpRecord) -> tuple[str, int, int] | None:
    """(family, rows, channels) of a sum down to one value a channel; None for other ops."""
    width = column_width(rec)
    if width:
        return COLUMN_SUM, rec.inputs[0].numel // width, width
    dim = channel_dim(rec)
    if dim is None:
        return None
    x = rec.inputs[0]
    channels = int(x.shape[dim])
    innermost = len(x.strides) == len(x.shape) and x.strides[dim] == 1  # channels_last
    return (COLUMN_SUM if innermost else CHANNEL_SUM), x.numel // channels, channels


def grid_key(family: str, measured: Mapping[str, float], rows: int, channels: int) -> str | None:
    """Of `family`'s measured "<family>@<rows>x<channels>" figures, the one nearest (rows,
    channels) by ratio; for column sums the width-only figures (at `WIDTH_ROWS` rows) and the
    family's own (at `BASE_SHAPE`) compete too. None where the family has no such grid."""
    points: dict[str, tuple[int, int]] = {}
    widths: dict[str, tuple[int, int]] = {}
    for key in measured:
        base, _, size = key.partition("@")
        r, x, c = size.partition("x")
        if base != family or not r.isdigit():
            continue
        if x and c.isdigit():
            points[key] = (int(r), int(c))
        elif not x and family == COLUMN_SUM:
            widths[key] = (WIDTH_ROWS, int(r))
    if not points:
        return None
    if family == COLUMN_SUM:
        points.update(widths)
        if family in measured:
            points[family] = BASE_SHAPE

    def distance(key: str) -> tuple[float, tuple[int, int]]:
        r, c = points[key]
        return math.hypot(math.log(r / rows), math.log(c / channels)), points[key]

    return min(points, key=distance)


def _dims(rec: OpRecord) -> tuple[int, ...]:
    dims = rec.params.get("dim")
    return (dims,) if isinstance(dims, int) else tuple(dims or ())
