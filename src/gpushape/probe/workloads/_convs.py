"""The convolution workloads `gpushape probe` lists last (`probe.workloads.WORKLOADS`), most
measured their own way (probe/convs.py) rather than by probe/memory.measure_family: NCHW
convolutions against channels_last, patch embeddings and a downsampling against the GEMM model's
rate, and s2d-stem's convolutions and its input's fold. And FamilyWorkload, the entry both
modules list (`probe.workloads` re-exports it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ._modules import _downsample, _s2d_fold


@dataclass(frozen=True)
class FamilyWorkload:
    """`passes`: for gpushape's fused kernels (not traced: the meta trace would record their
    plain-PyTorch reference), the minimum bytes of the step as passes over its parameter.
    `measure`: a family measured its own way instead of `measure_family` (same arguments).
    `train`: False times and traces the forward alone (a family that is one pass's kernel)."""

    family: str
    describe: str
    build: Callable[[float], nn.Module] | None
    passes: float = 0
    measure: Callable[..., dict[str, Any]] | None = None
    train: bool = True


def _nchw_conversion(work: FamilyWorkload, spec: Any, **kwargs: Any) -> dict[str, Any]:
    from ..convs import measure_nchw_conversion  # it imports probe/memory.py

    return measure_nchw_conversion(work, spec, **kwargs)


def _downsample_conv(work: FamilyWorkload, spec: Any, **kwargs: Any) -> dict[str, Any]:
    from ..convs import measure_downsample_conv  # it imports probe.workloads

    return measure_downsample_conv(work, spec, **kwargs)


def _stem_conv(work: FamilyWorkload, spec: Any, **kwargs: Any) -> dict[str, Any]:
    from ..convs import measure_stem_conv  # it imports probe/memory.py

    return measure_stem_conv(work, spec, **kwargs)


def _stem_conversion(work: FamilyWorkload, spec: Any, **kwargs: Any) -> dict[str, Any]:
    from ..convs import measure_stem_conversion  # it imports probe/memory.py

    return measure_stem_conversion(work, spec, **kwargs)


def _s2d_stem(work: FamilyWorkload, spec: Any, **kwargs: Any) -> dict[str, Any]:
    from ..convs import measure_s2d_stem  # it imports probe/memory.py

    return measure_s2d_stem(work, spec, **kwargs)


CONV_WORKLOADS = (
    # not a kernel family: NCHW convolutions' loss against channels_last (probe/convs.py)
    FamilyWorkload(
        "nchw_conversion",
        "ResNet-50 bottleneck convolutions (stages 1 and 3, "
        "batch 64), training, NCHW against channels_last",
        None,
        measure=_nchw_conversion,
    ),
    # not a kernel family: what ResNet's stem loses in NCHW, as an efficiency of its
    # conversions' bytes (probe/convs.py; nchw_conversion_stem@<stride> from other stems' rows)
    FamilyWorkload(
        "nchw_conversion_stem",
        "Conv2d(3, 64, 7, stride 2, padding 3) (ResNet's stem) on 64x3x224x224 channels_last, "
        "forward + weight gradient",  # its row's: conversion_row makes it "NCHW against ..."
        lambda s: nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        measure=_stem_conversion,
    ),
    # not a kernel family: a patch embedding on 3 channels against the GEMM model's rate, as
    # conv_small_cin is for the 7x7 stride-2 stem, its NCHW conversions' rate beside it
    # ("nchw_conversion@<side>", probe/convs.py)
    FamilyWorkload(
        "patch_conv@4",
        "Conv2d(3, 96, 4, stride 4) (ConvNeXt's, Swin's stem) on 64x3x224x224 channels_last, "
        "forward + weight gradient",
        lambda s: nn.Conv2d(3, 96, 4, stride=4, bias=False),
        measure=_stem_conv,
    ),
    # not a kernel family: a stem at stride 4 against the GEMM model's rate, as conv_small_cin
    # is for the 7x7 stride-2 one (probe/convs.py)
    FamilyWorkload(
        "small_cin_conv@4",
        "Conv2d(3, 64, 7, stride 4, padding 2) (PoolFormer's stem) on 64x3x224x224 "
        "channels_last, forward + weight gradient",
        lambda s: nn.Conv2d(3, 64, 7, stride=4, padding=2, bias=False),
        measure=_stem_conv,
    ),
    FamilyWorkload(
        "downsample_conv@2",
        "Conv2d(96, 192, 2, stride 2) (ConvNeXt-T's first downsampling) on 64x96x56x56 "
        "channels_last, forward and both gradients",
        _downsample,
        measure=_downsample_conv,
    ),
    # not a kernel family: s2d-stem's convolution against the GEMM model's rate for it
    FamilyWorkload(
        "s2d_stem",
        "Conv2d(3, 64, 7, stride 2, padding 3) (ResNet's stem) as s2d-stem computes it: "
        "Conv2d(16, 64, 4) on the space-to-depth input, 64x16x115x115 channels_last, "
        "forward + weight gradient",
        lambda s: nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        measure=_s2d_stem,
    ),
    FamilyWorkload(
        "s2d_fold",
        "s2d-stem's fold of ResNet's stem input (pad 3, pixel_unshuffle 2, channels 12 -> 16) "
        "on 64x3x224x224 channels_last, forward",
        _s2d_fold,
        train=False,
    ),
    FamilyWorkload(
        "s2d_stem@2",
        "Conv2d(3, 32, 3, stride 2, padding 1) (EfficientNet's, MobileNet's stem) as s2d-stem "
        "computes it: Conv2d(16, 32, 2) on the space-to-depth input, 64x16x113x113 "
        "channels_last, forward + weight gradient",
        lambda s: nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False),
        measure=_s2d_stem,
    ),
    FamilyWorkload(
        "patch_conv@16",
        "Conv2d(3, 768, 16, stride 16) (ViT-B/16's) on 64x3x224x224 channels_last, "
        "forward + weight gradient",
        lambda s: nn.Conv2d(3, 768, 16, stride=16, bias=False),
        measure=_stem_conv,
    ),
)
