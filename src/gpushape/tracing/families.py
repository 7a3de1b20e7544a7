"""Memory families: the kind of eager kernel an op runs, for measured bandwidth efficiencies.

The roofline prices an op's minimum bytes at the chip's copy rate. Eager PyTorch kernels of
some kinds reach only a fraction of it: on an H200 LayerNorm moves its bytes at about a third of
the copy rate, and pooling and embedding backward at less. `gpushape probe` measures that
fraction per family (`probe/memory.py`), the profile carries it, and the cost model
divides an op's memory time by it (`Achievable.memory_efficiency`). An op outside every family,
or a family the profile has not measured, keeps the copy rate.

Some families' rates depend on one size of the op the family name does not say: the length of
the rows a LayerNorm normalizes, the channels an NCHW BatchNorm gives one thread block each, the
kernel side of a depthwise convolution. The probe measures those at several sizes, kept as
"<family>@<size>" (`SIZE_VARIANTS`), and an op is priced at the measured size nearest its own
(`op_family`). A family with nothing measured falls back to the one it refines (`FALLBACK`, an
NCHW family to its channels_last one), so a profile measured before a refinement prices ops as
it did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .copies import (
    COPIES,
    COPY_FAMILIES,
    JOINED,
    PERMUTED_CAT,
    PERMUTED_STACK,
    TRANSPOSED_TO_NCHW,
    copy_family,
)
from .flops.attention import ATTENTION_PASS
from .flops.conv import S2D_FOLD, S2D_STEM, direct_conv
from .flops.registry import packet
from .fused_families import FUSED, KERNEL_FAMILIES
from .layout import copy_op_kind, runs_nchw, runs_nhwc, strided_operand
from .records import OpRecord
from .sums import CHANNEL_SUM, GEMV_SUM, column_width, grid_key, row_length, sum_shape

FAMILIES: dict[str, tuple[str, ...]] = {
    "norm": (
        "aten.native_layer_norm",
        "aten.native_layer_norm_backward",
        "aten._fused_rms_norm",
        "aten._fused_rms_norm_backward",
    ),
    # GroupNorm: one block per (sample, group) for the statistics, so PoolFormer's one group over
    # 64 samples kept 64 blocks busy, at 0.13 of the copy rate on an H100; by that count of
    # blocks (SIZE_BASE); priced as a row norm until measured (FALLBACK)
    "group_norm": ("aten.native_group_norm", "aten.native_group_norm_backward"),
    "batch_norm": (
        "aten.native_batch_norm",
        "aten.native_batch_norm_backward",
        "aten._native_batch_norm_legit",
        "aten._native_batch_norm_legit_functional",
        "aten._native_batch_norm_legit_no_training",
        "aten._batch_norm_with_update",
        "aten.batch_norm_backward",
        "aten.cudnn_batch_norm",
        "aten.cudnn_batch_norm_backward",
    ),
    "softmax": (
        "aten._softmax",
        "aten._softmax_backward_data",
        "aten._log_softmax",
        "aten._log_softmax_backward_data",
    ),
    "pool": (
        "aten.max_pool2d_with_indices",
        "aten.max_pool2d_with_indices_backward",
        "aten._adaptive_avg_pool2d",
        "aten._adaptive_avg_pool2d_backward",
        "aten.max_pool3d_with_indices",
        "aten.max_pool3d_with_indices_backward",
    ),
    # a sliding average (PoolFormer's and EfficientFormer's token mixer: 3x3, stride 1): on an
    # H100 PyTorch's NCHW kernels ran it at a third of the max pool's rate, backward slower still
    "avg_pool": (
        "aten.avg_pool2d",
        "aten.avg_pool2d_backward",
        "aten.avg_pool3d",
        "aten.avg_pool3d_backward",
    ),
    # forward gathers: rows read from a table (an embedding's lookup)
    "gather": ("aten.embedding", "aten.index_select", "aten.gather", "aten.index"),
    # accumulating scatters: an embedding's backward (sort the ids, sum each id's rows), index_put
    # with accumulate=True (an indexed read's backward), index_add, scatter_add
    "scatter_add": (
        "aten.embedding_dense_backward",
        "aten.index_add",
        "aten.scatter_add",
    ),
    "roll": ("aten.roll",),
    "dropout": ("aten.native_dropout", "aten.native_dropout_backward"),
    # pointwise ops with transcendental math (eager kernels run them below the copy rate)
    "activation": (
        "aten.gelu",
        "aten.gelu_backward",
        "aten.silu",
        "aten.silu_backward",
        "aten.tanh",
        "aten.tanh_backward",
        "aten.sigmoid",
        "aten.sigmoid_backward",
        "aten.elu",
        "aten.elu_backward",
        "aten.softplus",
        "aten.softplus_backward",
        "aten.mish",
        "aten.mish_backward",
        "aten.erf",
        "aten.exp",
    ),
}
_BY_PACKET = {op: family for family, ops in FAMILIES.items() for op in ops}
INDEX_PUT = frozenset({"aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
# Families whose eager kernels depend on the memory format: on 4-D tensors in NCHW
# (contiguous) PyTorch runs other kernels than on channels_last ones (the H200 ran ResNet-50's
# NCHW BatchNorm several times slower), so the probe measures them apart. Where a profile lacks
# the NCHW figure, the family's own prices them (`FALLBACK`).
NCHW_VARIANTS = {
    "batch_norm": "batch_norm_nchw",
    "pool": "pool_nchw",
    "avg_pool": "avg_pool_nchw",
    "fused_max_pool": "fused_max_pool_nchw",  # gpushape's max pool on NCHW input
}
NCHW_BASE = {nchw: base for base, nchw in NCHW_VARIANTS.items()}  # NCHW family -> its own
# Depthwise and narrow grouped convolutions run as direct kernels bound by their bytes
# (tracing/flops/conv.py), unlike every other convolution (GEMMs): a family of their own, and
# another in NCHW, where cuDNN runs other direct kernels (not a layout the nchw-conv rule
# prices: no conversions there).
CONV_OPS = frozenset(
    {
        "aten.convolution",
        "aten._convolution",
        "aten.convolution_overrideable",
        "aten.cudnn_convolution",
        "aten.convolution_backward",
        "aten.convolution_backward_overrideable",
    }
)
GROUPED_CONV = "grouped_conv"
GROUPED_CONV_NCHW = "grouped_conv_nchw"
# Families whose rate depends on one size of the op (the module docstring): measured as
# "<family>@<size>" beside the family's own figure, taken at SIZE_BASE's size.
#   norm, softmax: the row length (last dimension); LayerNorm over 96 or 768 values keeps fewer
#     bytes in flight per row than over 4096, and the H200 ran short-row norms far below it.
#   batch_norm_nchw: the channels. PyTorch's NCHW BatchNorm reduces each channel in one thread
#     block (statistics forward, the whole backward), so 16 channels keep 16 of 132 SMs busy.
#   grouped_conv(_nchw): the kernel side; a 5x5 depthwise tap loop is not a 7x7 one.
#   reduction: a column sum's width (a Linear's bias gradient, `grad.sum(0)` over every token):
#     PyTorch's reduction kernel spreads fewer columns over fewer blocks; the H200 summed 16384
#     rows of 768 at 0.24 of the copy rate, of 2304 at 0.48, of 3072 at 0.58 (CUDA graphs,
#     benchmarks/kernels/probe_bias_grad.py). Other reductions take the family's own figure.
SIZE_BASE = {
    "norm": 4096,
    "group_norm": 64,  # samples x groups
    "softmax": 1024,
    "reduction": 1024,
    "batch_norm_nchw": 256,
    GROUPED_CONV: 7,
    GROUPED_CONV_NCHW: 7,
}
SIZE_VARIANTS = (
    "reduction@768",
    "reduction@2304",
    "reduction@3072",
    "norm@96",
    "norm@192",
    "norm@384",
    "norm@768",
    "group_norm@2048",
    "batch_norm_nchw@16",
    "batch_norm_nchw@32",
    "batch_norm_nchw@64",
    "batch_norm_nchw@128",
    "grouped_conv_nchw@3",
    "grouped_conv_nchw@5",
)
# A pointwise op reading an operand laid out unlike its output (a broadcast, other strides):
# TensorIterator's indexed kernel instead of its vectorized one (layout.strided_operand).
ELEMENTWISE_STRIDED = "elementwise_strided"
# Matrix products by their bytes: where a GEMM is memory-bound (ConvNeXt-T's and Swin-T's MLPs
# over 96 and 192 channels, K or N of 96), cuBLAS streams below the copy rate. Convolutions and
# fused attention keep their own models (tracing/gemm_model.py).
GEMM = "gemm"
GEMM_OPS = frozenset(
    {
        "aten.mm",
        "aten.addmm",
        "aten.bmm",
        "aten.baddbmm",
        "aten._scaled_mm",
        "aten.matmul",
        "aten.linear",
    }
)
# What an unmeasured family is priced as: the family it refines.
FALLBACK = {
    **NCHW_BASE,
    GROUPED_CONV_NCHW: GROUPED_CONV,
    "scatter_add": "gather",
    ELEMENTWISE_STRIDED: "elementwise",
    PERMUTED_CAT: "permuted_copy",
    PERMUTED_STACK: PERMUTED_CAT,
    TRANSPOSED_TO_NCHW: "transposed_copy",
    CHANNEL_SUM: "reduction",
    "avg_pool": "pool",  # priced as the max pool, layout kept, until measured
    "group_norm": "norm",
    "avg_pool_nchw": "pool_nchw",
}
# Families from the op's tags, for ops no table above names.
TAGGED = {"pointwise": "elementwise", "reduction": "reduction"}
# Not a kernel family: the efficiency of a LayerNorm backward's weight-gradient kernel where it
# runs one block per 32 columns, against an SM's share of the copy rate (tracing/norm_grads.py).
WEIGHT_GRAD = "norm_weight_grad"
# Not kernel families, measured beside them:
# - what a convolution loses in NCHW against channels_last, as an efficiency of the bytes
#   cuDNN's layout conversions move (tracing/layout.py), "@<side>" a patch embedding's,
#   "nchw_conversion_stem" a stem's (fewer input channels than the alignment, overlapping
#   windows: ResNet's 7x7/2), "@<stride>" at other strides;
# - a patch embedding (fewer input channels than the tensor-core alignment, stride equal to the
#   kernel: ViT's 16x16/16, ConvNeXt's and Swin's 4x4/4) by its patch side: its rate over the
#   GEMM model's, as `conv_small_cin` is for a 7x7 stride-2 stem (tracing/gemm_model.py).
# - a patch convolution on aligned channels (ConvNeXt's 2x2/2 downsampling) by its side, the
#   same way (forward and both gradients).
LAYOUT = (
    "nchw_conversion",
    "nchw_conversion@4",
    "nchw_conversion@16",
    "nchw_conversion_stem",
    "nchw_conversion_stem@4",
)
# - Inductor's max-pool kernels (forward and backward) against the pool family's bytes: what
#   slow-max-pool prices PyTorch's max pool at under torch.compile (benchmarks/kernels/
#   fit_max_pool.py, from bench_max_pool.py's timings).
COMPILED_POOL = "pool_compiled"
PATCH_CONV = "patch_conv"
PATCH_VARIANTS = ("patch_conv@4", "patch_conv@16")
DOWNSAMPLE_CONV = "downsample_conv"
DOWNSAMPLE_VARIANTS = ("downsample_conv@2",)
S2D_VARIANTS = (S2D_STEM, f"{S2D_STEM}@2")
# - a stem (fewer input channels than the alignment, not a patch embedding) at a stride other
#   than 2, the stride `conv_small_cin` is measured at: its rate over the GEMM model's, by
#   stride (tracing/gemm_model.py `small_cin_rate`)
STEM_CONV = "small_cin_conv"
STEM_STRIDE = 2
STEM_VARIANTS = (f"{STEM_CONV}@4",)
# - s2d-stem's fold of its input (SpaceToDepthFold: a pad, pixel_unshuffle and a channel pad,
#   copies that ran at about a quarter of the copy rate on an H100): S2D_FOLD, by module.
# - s2d-stem's convolution (models/space_to_depth.py: a 7x7/2 RGB stem as a stride-1 4x4 convolution
#   on 16 folded channels): its forward and weight gradient against the GEMM model's time for
#   them (tracing/flops/conv.py `rate_key`), by its folded kernel side: "s2d_stem" at 4,
#   "s2d_stem@2" (a 3x3 stride-2 stem folded).
ALL_FAMILIES = (
    *FAMILIES,
    *NCHW_VARIANTS.values(),
    *SIZE_VARIANTS,
    GROUPED_CONV,
    GROUPED_CONV_NCHW,
    *sorted(COPIES),  # the copies between layouts and the cat kernel's (tracing/copies.py)
    *TAGGED.values(),
    ELEMENTWISE_STRIDED,
    GEMM,
    WEIGHT_GRAD,
    *FUSED,
    *LAYOUT,
    COMPILED_POOL,
    *PATCH_VARIANTS,
    *DOWNSAMPLE_VARIANTS,
    *S2D_VARIANTS,
    *STEM_VARIANTS,
    S2D_FOLD,
    ATTENTION_PASS,  # a fused attention backward's kernels beside its main one (flops/attention)
    CHANNEL_SUM,  # an NCHW per-channel sum (tracing/sums.py)
    GEMV_SUM,  # a column sum by a GEMV, as graph-layers takes it (steps/graph_layers_gemv.py)
)


def memory_family(rec: OpRecord) -> str | None:
    """The family whose measured efficiency prices `rec`'s bytes; None: the copy rate."""
    if rec.module_type == "SpaceToDepthFold":
        return S2D_FOLD
    op = packet(rec.op)
    if op in CONV_OPS:
        if not direct_conv(rec):
            return None
        return (
            GROUPED_CONV_NCHW
            if len(rec.inputs[0].shape) == 4 and not runs_nhwc(rec)
            else GROUPED_CONV
        )
    if op in GEMM_OPS:
        return GEMM
    kind = copy_op_kind(rec)
    if kind is not None:  # a cat or stack read permuted: PyTorch's cat kernel's strided path
        if op in JOINED:
            if kind != "permuted":
                return COPY_FAMILIES[kind]
            several = sum(1 for t in rec.inputs if t.numel) > 1
            return PERMUTED_STACK if several else PERMUTED_CAT
        source = rec.inputs[1] if op == "aten.copy_" else rec.inputs[0]
        return copy_family(source, kind)
    if op in INDEX_PUT:
        return "scatter_add" if rec.params.get("accumulate") else None
    family = _BY_PACKET.get(op) or KERNEL_FAMILIES.get(op)
    if family is not None:
        if family in NCHW_VARIANTS and runs_nchw(rec):
            return NCHW_VARIANTS[family]
        return family
    return _tagged(rec)


def _tagged(rec: OpRecord) -> str | None:
    for tag, name in TAGGED.items():
        if tag in rec.tags:
            if name == "elementwise" and strided_operand(rec):
                return ELEMENTWISE_STRIDED
            shape = sum_shape(rec) if name == "reduction" else None
            return shape[0] if shape else name
    return None


def op_family(rec: OpRecord, measured: Mapping[str, float]) -> str | None:
    """The family (or "<family>@<size>") whose figure in `measured` prices `rec`'s bytes: its
    own at the measured size nearest the op's, else what it falls back to. A copy between
    layouts whose kind is unmeasured is priced as the op was before copies had families (a
    clone by its tags, elementwise)."""
    family = memory_family(rec)
    shape = sum_shape(rec)
    if shape is not None and family == shape[0]:  # a sum down to one value a channel
        return sum_family(family, measured, shape[1], shape[2])
    if family == "group_norm" and not any(k.partition("@")[0] == family for k in measured):
        return priced_family("norm", measured, row_length(rec))  # as before it had a family
    priced = priced_family(family, measured, variant_size(rec, family))
    if family in COPIES and priced not in measured:
        return priced_family(_tagged(rec), measured)
    return priced


def priced_family(
    family: str | None, measured: Mapping[str, float], size: int | None = None
) -> str | None:
    """The family whose figure prices `family`: for a family measured at several sizes
    (`SIZE_BASE`), the measurement nearest `size` (by ratio); itself when measured; else what
    it falls back to (`FALLBACK`), priced the same way; else itself (unmeasured)."""
    if family is None:
        return None
    if family in SIZE_BASE and size:
        near = nearest_size(family, measured, size, SIZE_BASE[family])
        if near in measured:
            return near
    if family in measured:
        return family
    if family in FALLBACK:
        return priced_family(FALLBACK[family], measured, size)
    return family


def sum_family(family: str, measured: Mapping[str, float], rows: int, channels: int) -> str:
    """The figure pricing a sum of `rows` into `channels` values (tracing/sums.py): the nearest
    point of the family's measured grid, else of the column sums' grid (an unmeasured NCHW
    sum), else the family's figure by width as `priced_family` picks it."""
    for name in dict.fromkeys((family, FALLBACK.get(family, family))):
        key = grid_key(name, measured, rows, channels)
        if key is not None:
            return key
    width = channels if family == "reduction" else None
    return priced_family(family, measured, width) or family


def nearest_size(family: str, measured: Mapping[str, float], size: int, base: int) -> str:
    """Of `family`'s measured "<family>@<n>" figures (and its own, taken at `base`, when
    measured or when no variant is), the one whose n is nearest `size` by ratio."""
    sizes = {
        key: int(key.partition("@")[2])
        for key in measured
        if key.startswith(family + "@") and key.partition("@")[2].isdigit()
    }
    if family in measured or not sizes:
        sizes[family] = base
    return min(sizes, key=lambda key: (abs(math.log(sizes[key] / size)), sizes[key]))


def variant_size(rec: OpRecord, family: str | None) -> int | None:
    """The size `family`'s rate depends on (`SIZE_BASE`) for `rec`; None for other families."""
    if family in ("norm", "softmax"):
        return row_length(rec)
    if family == "group_norm" and "N" in rec.params and "group" in rec.params:
        return int(rec.params["N"]) * int(rec.params["group"])
    if family == "reduction":
        return column_width(rec)
    first = rec.inputs[0] if rec.inputs else None
    if family == "batch_norm_nchw" and first is not None and len(first.shape) > 1:
        return int(first.shape[1])
    if family in (GROUPED_CONV, GROUPED_CONV_NCHW):
        weight = rec.input("weight") if rec.has_input("weight") else rec.inputs[1]
        return int(weight.shape[-1]) if len(weight.shape) > 2 else None
    return None
