"""The workloads `gpushape probe` measures each memory family on (probe/memory.py measures them).

One workload per family of `tracing/families.py`: a training step (or a forward, `train=False`)
that is mostly that family, bf16, large enough to stream from memory. A family whose rate
depends on a size of the op (`families.SIZE_BASE`) has one workload per size, named
"<family>@<size>", each moving about the bytes of the family's own. `scale` shrinks the leading
dimension (a CPU smoke test: 0.002), and below 0.05 the spatial sizes too. The convolution
workloads measured their own way, and FamilyWorkload, live in _convs.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._convs import CONV_WORKLOADS, FamilyWorkload
from ._modules import (
    _batch_norm,
    _broadcast_mul,
    _channel_sum,
    _copies,
    _depthwise,
    _embedding,
    _fused,
    _kv_cat,
    _layer_norm,
    _layer_norm_weight_grad,
    _narrow_mlp,
    _qkv_stack,
    _rows,
    _side,
    _Workload,
)


def _weight_grad(work: FamilyWorkload, spec: Any, **kwargs: Any) -> dict[str, Any]:
    from ..memory import measure_weight_grad  # it imports this module

    return measure_weight_grad(work, spec, **kwargs)


# BatchNorm2d on NCHW at 16 to 256 channels, each at 64 x 256 x 56 x 56 elements
_BN_NCHW = {16: (224, 224), 32: (224, 112), 64: (112, 112), 128: (112, 56)}

WORKLOADS = (
    FamilyWorkload(
        "elementwise",
        "relu(x + y), x, y 8192x8192",
        lambda s: _Workload(
            lambda m, x, y: F.relu(x + y), (_rows(s, 8192), 8192), (_rows(s, 8192), 8192)
        ),
    ),
    FamilyWorkload(
        "activation",
        "gelu(x), x 8192x8192",
        lambda s: _Workload(lambda m, x: F.gelu(x), (_rows(s, 8192), 8192)),
    ),
    FamilyWorkload("norm", "LayerNorm(4096) on 32768x4096", lambda s: _layer_norm(s, 4096)),
    # the same bytes over shorter rows: BERT's and GPT-2's 768, ViT-S's 384, ConvNeXt-T's and
    # Swin-T's 96 and 192 (families.SIZE_BASE)
    FamilyWorkload("norm@768", "LayerNorm(768) on 174762x768", lambda s: _layer_norm(s, 768)),
    FamilyWorkload("norm@384", "LayerNorm(384) on 349525x384", lambda s: _layer_norm(s, 384)),
    FamilyWorkload("norm@192", "LayerNorm(192) on 699050x192", lambda s: _layer_norm(s, 192)),
    FamilyWorkload("norm@96", "LayerNorm(96) on 1398101x96", lambda s: _layer_norm(s, 96)),
    FamilyWorkload(
        "batch_norm",
        "BatchNorm2d(256), training, 64x256x56x56 channels_last",
        lambda s: _batch_norm(s, 256, 56, 56, channels_last=True),
    ),
    FamilyWorkload(
        "batch_norm_nchw",
        "BatchNorm2d(256), training, 64x256x56x56 NCHW",
        lambda s: _batch_norm(s, 256, 56, 56),
    ),
    # NCHW BatchNorm gives each channel one thread block: fewer channels, fewer busy SMs
    # (MobileNet's and EfficientNet's 16 to 120 channels at 112x112 to 28x28)
    *(
        FamilyWorkload(
            f"batch_norm_nchw@{c}",
            f"BatchNorm2d({c}), training, 64x{c}x{h}x{w} NCHW",
            lambda s, c=c, h=h, w=w: _batch_norm(s, c, h, w),
        )
        for c, (h, w) in _BN_NCHW.items()
    ),
    FamilyWorkload(
        "softmax",
        "softmax(dim=-1) on 65536x1024",
        lambda s: _Workload(lambda m, x: torch.softmax(x, -1), (_rows(s, 65536), 1024)),
    ),
    FamilyWorkload(
        "pool",
        "MaxPool2d(3, 2, 1) on 64x64x112x112 channels_last",
        lambda s: _Workload(
            lambda m, x: F.max_pool2d(x, 3, 2, 1), (_rows(s, 64), 64, 112, 112), channels_last=True
        ),
    ),
    FamilyWorkload(
        "pool_nchw",
        "MaxPool2d(3, 2, 1) on 64x64x112x112 NCHW",
        lambda s: _Workload(lambda m, x: F.max_pool2d(x, 3, 2, 1), (_rows(s, 64), 64, 112, 112)),
    ),
    # GroupNorm, NCHW, one block per (sample, group): over one group (PoolFormer's norm), and
    # over 32 (ResNet-50-GN's), the same bytes (families.SIZE_BASE: samples x groups)
    *(
        FamilyWorkload(
            f"group_norm{suffix}",
            f"GroupNorm({groups}, 64) on 64x64x56x56 NCHW ({what})",
            lambda s, g=groups: _Workload(
                lambda m, x: m.layers["gn"](x),
                (_rows(s, 64), 64, _side(s, 56), _side(s, 56)),
                modules={"gn": nn.GroupNorm(g, 64)},
            ),
        )
        for suffix, groups, what in (
            ("", 1, "PoolFormer-S12's first stage"),
            ("@2048", 32, "32 groups, as ResNet-50-GN's"),
        )
    ),
    # a sliding average, PoolFormer's and EfficientFormer's token mixer (3x3, stride 1)
    *(
        FamilyWorkload(
            f"avg_pool{suffix}",
            f"AvgPool2d(3, 1, 1, count_include_pad=False) on 64x48x56x56 {layout}",
            lambda s, cl=not suffix: _Workload(
                lambda m, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
                (_rows(s, 64), 48, 56, 56),
                channels_last=cl,
            ),
        )
        for suffix, layout in (("", "channels_last"), ("_nchw", "NCHW"))
    ),
    # an embedding's two passes apart: the forward gathers rows, the backward sorts the ids and
    # sums each id's rows into a zeroed table (the gather's forward priced as another op)
    FamilyWorkload(
        "gather",
        "Embedding(30522, 768) over 64x512 token ids, forward",
        lambda s: _embedding(s, 64),
        train=False,
    ),
    FamilyWorkload(
        "scatter_add",
        "Embedding(30522, 768) over 16x512 token ids, backward (forward priced apart)",
        lambda s: _embedding(s, 16),
    ),
    FamilyWorkload(
        "permuted_copy",
        "7x7 window partition (Swin) of 64x56x56x96, forward and backward",
        lambda s: _copies(s, "permuted"),
    ),
    FamilyWorkload(
        "permuted_cat",
        "a key/value cache's first append (GPT-2's): cat of 32x1024x12x64 viewed as "
        "32x12x1024x64 onto an empty tensor, forward",
        _kv_cat,
        train=False,
    ),
    FamilyWorkload(
        "permuted_stack",
        "unbind's backward (timm's attention): a stack of three 64x197x12x64 viewed as "
        "64x12x197x64, forward",
        _qkv_stack,
        train=False,
    ),
    FamilyWorkload(
        "transposed_copy",
        "NCHW to NHWC copy of 64x96x56x56",
        lambda s: _copies(s, "transposed"),
    ),
    FamilyWorkload(
        "transposed_copy_nchw",
        "NHWC to NCHW copy of 64x56x56x96 (a gradient put back in an NCHW convolution's layout)",
        lambda s: _copies(s, "transposed_nchw"),
    ),
    FamilyWorkload(
        "roll",
        "roll by (-3, -3) over H and W of 64x56x56x96 (Swin's shift), forward and backward",
        lambda s: _copies(s, "roll"),
    ),
    # a ConvNeXt stage's depthwise 7x7 (MobileNet's and EfficientNet's 3x3 and 5x5 run alike)
    FamilyWorkload(
        "grouped_conv",
        "depthwise Conv2d(384, 7x7, groups=384) on 64x384x28x28 channels_last",
        lambda s: _depthwise(s, 384, 28, 7, channels_last=True),
    ),
    # ... and in NCHW, where cuDNN runs other direct kernels, by kernel side
    FamilyWorkload(
        "grouped_conv_nchw",
        "depthwise Conv2d(384, 7x7, groups=384) on 64x384x28x28 NCHW",
        lambda s: _depthwise(s, 384, 28, 7, channels_last=False),
    ),
    FamilyWorkload(
        "grouped_conv_nchw@5",
        "depthwise Conv2d(240, 5x5, groups=240) on 64x240x28x28 NCHW",
        lambda s: _depthwise(s, 240, 28, 5, channels_last=False),
    ),
    FamilyWorkload(
        "grouped_conv_nchw@3",
        "depthwise Conv2d(144, 3x3, groups=144) on 64x144x56x56 NCHW",
        lambda s: _depthwise(s, 144, 56, 3, channels_last=False),
    ),
    # a pointwise op on a broadcast operand runs TensorIterator's indexed kernel, not the
    # vectorized one (tracing/layout.strided_operand): DropPath, layer scales, SE gates
    FamilyWorkload(
        "elementwise_strided",
        "x * s, s (64, 1, 1, 1) broadcast (DropPath's mask), x 64x56x56x96, forward and backward",
        _broadcast_mul,
    ),
    # memory-bound matrix products: ConvNeXt-T's and Swin-T's first-stage MLP at batch 64
    FamilyWorkload(
        "gemm",
        "Linear(96, 384) and Linear(384, 96), no bias, on 200704x96, forward and backward",
        _narrow_mlp,
    ),
    # not a kernel family: a LayerNorm backward's weight gradients summed one block per 32
    # columns (M <= 64 x 1024 rows: PyTorch's columns path), against an SM's share of the copy
    # rate (probe/memory.measure_weight_grad)
    FamilyWorkload(
        "norm_weight_grad",
        "LayerNorm(192) weight and bias gradients alone over 50176 rows (ConvNeXt-T's and "
        "Swin-T's second stage at batch 64: 6 blocks of 32 columns)",
        _layer_norm_weight_grad,
        measure=_weight_grad,
        train=False,
    ),
    FamilyWorkload(
        "dropout",
        "dropout(p=0.1), training, 8192x8192",
        lambda s: _Workload(lambda m, x: F.dropout(x, 0.1, True), (_rows(s, 8192), 8192)),
    ),
    FamilyWorkload(
        "reduction",
        "sum over rows of 65536x1024 (a bias gradient's shape)",
        lambda s: _Workload(lambda m, x: x.sum(0), (_rows(s, 65536), 1024)),
    ),
    # narrower and wider column sums (families.SIZE_BASE): BERT's, GPT-2's and ViT-B's biases
    # over 16384 tokens, 768 wide, their fused QKV's 2304 and their MLPs' 3072
    *(
        FamilyWorkload(
            f"reduction@{n}",
            f"sum over rows of 16384x{n} (a bias gradient)",
            lambda s, n=n: _Workload(lambda m, x: x.sum(0), (_rows(s, 16384), n)),
        )
        for n in (768, 2304, 3072)
    ),
    # narrow sums by rows and channels (tracing/sums.py): ConvNeXt-T's and Swin-T's first three
    # stages at batch 64, as column sums (bias gradients) and as NCHW per-channel sums
    *(
        FamilyWorkload(
            f"{family}@{rows}x{c}",
            f"sum of {rows}x{c} into {c} values ({layout})",
            lambda s, rows=rows, c=c, layout=layout: _channel_sum(s, rows, c, layout),
            train=False,
        )
        for family, layout in (("reduction", "columns"), ("channel_sum", "NCHW"))
        for rows in (12544, 50176, 200704)
        for c in (96, 192, 384)
    ),
    # fwd: read x, write y; bwd: read dy and x (or y), write dx
    FamilyWorkload(
        "fused_norm_act",
        "gpushape LayerNormGELU(4096) on 32768x4096",
        lambda s: _fused("norm_act", s),
        passes=5,
    ),
    # the bytes the audit keeps for a BatchNorm -> add -> ReLU chain once fused: the eager
    # chain's 16 passes (BatchNorm 3 + add 3 + ReLU 2 forward; ReLU 3 + BatchNorm 5 backward,
    # re-reads included) less the 8 the fusion removes; the kernel itself makes 10
    FamilyWorkload(
        "fused_batch_norm_act",
        "gpushape BatchNormAct2d(256) + residual, training, 64x256x56x56 channels_last",
        lambda s: _fused("batch_norm_act", s),
        passes=8,
    ),
    FamilyWorkload(
        "fused_softmax_dropout",
        "gpushape SoftmaxDropout(0.1) on 65536x1024",
        lambda s: _fused("softmax_dropout", s),
        passes=5,
    ),
    # fwd: read x and residual, write the sum and y; bwd: read dy and the sum, write the
    # residual's and x's gradients (the mask regenerated)
    FamilyWorkload(
        "fused_dropout_add_norm",
        "gpushape dropout_add_layer_norm(p=0.1) on 16384x768 (BERT-base's block output)",
        lambda s: _fused("dropout_add_norm", s),
        passes=8,
    ),
    # a 3x3 stride-2 window: y is a quarter of x, its int8 window positions an eighth (bf16);
    # fwd: read x, write y and the positions; bwd: read the positions and dy, write dx
    FamilyWorkload(
        "fused_max_pool",
        "gpushape MaxPool2d(3, 2, 1) on 64x64x112x112 channels_last, training",
        lambda s: _fused("max_pool", s),
        passes=2.75,
    ),
    # fwd: read x twice (the sums, then the scaling), write y; bwd: read dy and x twice, write dx
    FamilyWorkload(
        "fused_grn",
        "gpushape GlobalResponseNorm(384) on 64x56x56x384 (ConvNeXt-V2-T's first stage), training",
        lambda s: _fused("grn", s),
        passes=8,
    ),
    # as fused_grn's: fwd reads x twice and writes y; bwd reads dy and x twice and writes dx
    FamilyWorkload(
        "fused_group_norm",
        "gpushape GroupNormAct(32, 256, relu) on 64x256x56x56 NCHW (ResNet-50-GN's first stage), "
        "training",
        lambda s: _fused("group_norm", s),
        passes=8,
    ),
    *CONV_WORKLOADS,
)
