"""ResNet-50 v1.5 (the stride sits on the 3x3 conv) with torchvision's module and state_dict names.

25,557,032 parameters; a 1x3x224x224 forward is 4.09 GMACs. Convolutions carry no bias (the
BatchNorm after each would cancel it). The textbook baseline: NCHW, separate BN and ReLU.

`resnet50-gpu` is the design guide's "GPU-optimized ResNet" (its section 4.2), kept apart from
the baseline because it is a different network: the image zero-padded from 3 to 32 channels
before the 7x7 stem (the guide's "channel count a multiple of 32"), and every bottleneck's 3x3
convolution twice as wide (64 -> 128 in the first stage, the 1x1 expansion reading 128). It
has 42,002,664 parameters and a 1x3x224x224 forward of 7.90 GMACs, 1.93x ResNet-50's (the
stem alone goes from 0.12 to 1.26 GMACs; tests/models/test_zoo.py counts both);
docs/design.md ("The guide's GPU-optimized ResNet") says what it costs and buys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import GpushapeError
from ._build import build, configure, float_input
from .registry import ModelAndInputs, register_model


@dataclass(frozen=True, kw_only=True)
class ResNetConfig:
    blocks: tuple[int, ...] = (3, 4, 6, 3)  # bottlenecks per stage
    width: int = 64  # stem channels; stage i is width * 2**i wide inside, 4x that outside
    num_classes: int = 1000
    stem_in: int = 3  # channels the stem convolution reads: the image zero-padded up to them
    mid: int = 1  # a bottleneck's 3x3 convolution is mid x its inner width wide


RESNET50 = ResNetConfig()
RESNET50_GPU = ResNetConfig(stem_in=32, mid=2)  # the design guide's section 4.2
EXPANSION = 4  # a bottleneck's output is 4x its inner width


def conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False)


def conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (strided) -> 1x1 expand, plus the (projected) shortcut."""

    def __init__(self, in_ch: int, inner: int, stride: int = 1, mid: int = 1) -> None:
        super().__init__()
        out_ch = inner * EXPANSION
        self.conv1 = conv1x1(in_ch, inner)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = conv3x3(inner, inner * mid, stride)
        self.bn2 = nn.BatchNorm2d(inner * mid)
        self.conv3 = conv1x1(inner * mid, out_ch)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(conv1x1(in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig = RESNET50) -> None:
        super().__init__()
        width, mid = config.width, config.mid
        if config.stem_in < 3 or mid < 1:
            raise GpushapeError(
                f"resnet: stem_in must be at least 3 and mid at least 1, got {config.stem_in} "
                f"and {mid}"
            )
        self.stem_pad = config.stem_in - 3
        self.conv1 = nn.Conv2d(
            config.stem_in, width, kernel_size=7, stride=2, padding=3, bias=False
        )
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_ch = width
        for i, count in enumerate(config.blocks):
            inner = width * 2**i
            stride = 1 if i == 0 else 2  # stage 1 follows the max-pool, already at stride 4
            stage = [Bottleneck(in_ch, inner, stride, mid)]
            in_ch = inner * EXPANSION
            stage += [Bottleneck(in_ch, inner, mid=mid) for _ in range(count - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.num_stages = len(config.blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_ch, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem_pad:  # zero channels after the image's three (NCHW's dim 1)
            x = F.pad(x, (0, 0, 0, 0, 0, self.stem_pad))
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64, H/4, W/4)
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)  # (B, 256 * 2**i, H/2**(i+2), W/2**(i+2))
        x = torch.flatten(self.avgpool(x), 1)  # (B, 2048)
        return self.fc(x)  # (B, num_classes)


def init_resnet_(model: nn.Module) -> None:
    """He init (fan-out) for convs, BatchNorm at identity; the Linear keeps its default."""
    for sub in model.modules():
        if isinstance(sub, nn.Conv2d):
            nn.init.kaiming_normal_(sub.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(sub, nn.BatchNorm2d):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


@register_model(
    "resnet50",
    default_batch=32,
    description="ResNet-50 v1.5 (torchvision layout), 25.6M params, 224x224 images",
)
def resnet50(
    *, batch: int, dtype: torch.dtype, device: torch.device, image_size: int = 224, **options: Any
) -> ModelAndInputs:
    config = configure("resnet50", RESNET50, options)
    model = build(lambda: ResNet(config), dtype=dtype, device=device, init=init_resnet_)
    return model, (float_input((batch, 3, image_size, image_size), dtype, device),)


@register_model(
    "resnet50-gpu",
    default_batch=32,
    description="the design guide's GPU-optimized ResNet-50: stem on 32 channels, 3x3s twice "
    "as wide; 42.0M params, 1.93x the FLOPs",
)
def resnet50_gpu(
    *, batch: int, dtype: torch.dtype, device: torch.device, image_size: int = 224, **options: Any
) -> ModelAndInputs:
    config = configure("resnet50-gpu", RESNET50_GPU, options)
    model = build(lambda: ResNet(config), dtype=dtype, device=device, init=init_resnet_)
    return model, (float_input((batch, 3, image_size, image_size), dtype, device),)
