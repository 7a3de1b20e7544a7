"""Memory families: the kind of eager kernel an op runs, for measured bandwidth efficiencies.

The roofline prices an op's minimum bytes at the chip's copy rate. Eager PyTorch kernels of
some kinds reach only a fraction of it: on an H200 LayerNorm moves its bytes at about a third of
the copy rate, and pooling and embedding backward at less. `gpushape probe` measures that
fraction per family (`probe/memory.py`), the profile carries it, and the cost model
divides an op's memory time by it (`Achievable.memory_efficiency`). An op outside every family,
or a family the profile has not measured, keeps the copy rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .flops.conv import direct_conv
from .flops.registry import packet
from .layout import runs_nchw
from .records import OpRecord

FAMILIES: dict[str, tuple[str, ...]] = {
    "norm": (
        "aten.native_layer_norm",
        "aten.native_layer_norm_backward",
        "aten.native_group_norm",
        "aten.native_group_norm_backward",
        "aten._fused_rms_norm",
        "aten._fused_rms_norm_backward",
    ),
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
        "aten.avg_pool2d",
        "aten.avg_pool2d_backward",
        "aten._adaptive_avg_pool2d",
        "aten._adaptive_avg_pool2d_backward",
        "aten.max_pool3d_with_indices",
        "aten.max_pool3d_with_indices_backward",
    ),
    "gather": (
        "aten.embedding",
        "aten.embedding_dense_backward",
        "aten.index_select",
        "aten.gather",
        "aten.index",
        "aten.index_add",
        "aten.scatter_add",
    ),
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
# Families whose eager kernels depend on the memory format: on 4-D tensors in NCHW
# (contiguous) PyTorch runs other kernels than on channels_last ones (the H200 ran ResNet-50's
# NCHW BatchNorm several times slower), so the probe measures them apart. Where a profile lacks
# the NCHW figure, the family's own prices them (`priced_family`).
NCHW_VARIANTS = {"batch_norm": "batch_norm_nchw", "pool": "pool_nchw"}
NCHW_BASE = {nchw: base for base, nchw in NCHW_VARIANTS.items()}  # NCHW family -> its own
# Depthwise and narrow grouped convolutions run as direct kernels bound by their bytes
# (tracing/flops/conv.py), unlike every other convolution (GEMMs): a family of their own.
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
# Families whose eager kernels' rate depends on the row they normalize: LayerNorm over 768
# values keeps fewer bytes in flight per row than over 4096, and the H200 ran BERT's and ViT's
# norms well below the rate measured at 4096. The probe measures them at several row lengths,
# kept as "<family>@<row length>" beside the family's own figure (taken at ROW_BASE's length),
# and an op is priced at the measured row length nearest its own (`priced_family`).
ROW_BASE = {"norm": 4096, "softmax": 1024}
ROW_VARIANTS = ("norm@384", "norm@768")
# Families from the op's tags, for ops no table above names.
TAGGED = {"pointwise": "elementwise", "reduction": "reduction"}
# gpushape's own fused kernels, which the audit's fusion rules propose: what they reach prices
# a fix's kernel (`AuditContext.fusion_saving_s`), not a traced op.
FUSED = ("fused_norm_act", "fused_batch_norm_act", "fused_softmax_dropout")
# ... and the same kernels where a model already runs them (an optimized model's trace records
# their custom ops, one op a pass, as torch.compile and CUDA graphs see them).
KERNEL_FAMILIES = {
    "gpushape.layer_norm_gelu": "fused_norm_act",
    "gpushape.layer_norm_gelu_backward": "fused_norm_act",
    "gpushape.add_layer_norm": "fused_norm_act",
    "gpushape.add_layer_norm_backward": "fused_norm_act",
    "gpushape.rms_norm": "fused_norm_act",
    "gpushape.rms_norm_backward": "fused_norm_act",
    "gpushape.batch_norm_stats": "fused_batch_norm_act",
    "gpushape.batch_norm_act_apply": "fused_batch_norm_act",
    "gpushape.batch_norm_act_backward": "fused_batch_norm_act",
    "gpushape.softmax_dropout_fwd": "fused_softmax_dropout",
    "gpushape.softmax_dropout_bwd": "fused_softmax_dropout",
}
# What a convolution loses in NCHW against channels_last, as an efficiency of the bytes cuDNN's
# layout conversions move (tracing/layout.py): the cost model's price of NCHW convolutions.
LAYOUT = ("nchw_conversion",)
ALL_FAMILIES = (
    *FAMILIES,
    *NCHW_VARIANTS.values(),
    *ROW_VARIANTS,
    GROUPED_CONV,
    *TAGGED.values(),
    *FUSED,
    *LAYOUT,
)


def memory_family(rec: OpRecord) -> str | None:
    """The family whose measured efficiency prices `rec`'s bytes; None: the copy rate."""
    if packet(rec.op) in CONV_OPS:
        return GROUPED_CONV if direct_conv(rec) else None
    family = _BY_PACKET.get(packet(rec.op)) or KERNEL_FAMILIES.get(packet(rec.op))
    if family is not None:
        if family in NCHW_VARIANTS and runs_nchw(rec):
            return NCHW_VARIANTS[family]
        return family
    for tag, name in TAGGED.items():
        if tag in rec.tags:
            return name
    return None


def priced_family(
    family: str | None, measured: Mapping[str, float], row: int | None = None
) -> str | None:
    """The family whose figure prices `family`: for a family measured at several row lengths
    (`ROW_BASE`), the measurement nearest `row` (by ratio); itself when measured; else the
    family an NCHW variant belongs to (`NCHW_VARIANTS`)."""
    if family in ROW_BASE and row:
        return _nearest_row(family, measured, row)
    if family is None or family in measured:
        return family
    return NCHW_BASE.get(family, family)


def _nearest_row(family: str, measured: Mapping[str, float], row: int) -> str:
    lengths = {key: int(key.partition("@")[2]) for key in measured if key.startswith(family + "@")}
    if family in measured or not lengths:
        lengths[family] = ROW_BASE[family]
    return min(lengths, key=lambda key: abs(math.log(lengths[key] / row)))


def row_length(rec: OpRecord) -> int | None:
    """The length of the rows a norm or softmax works on: its input's last dimension."""
    first = rec.inputs[0] if rec.inputs else None
    return int(first.shape[-1]) if first is not None and first.shape else None
