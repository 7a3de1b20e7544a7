"""The small modules `gpushape probe` times its memory families on (`probe.workloads` names
each with its family and size): a training step over tensors the module owns, mostly one
family's op, bf16 when measured. `scale` shrinks the leading dimension, and below SMOKE the
spatial sizes too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

SMOKE = 0.05  # scales below this shrink spatial sizes as well


class _Workload(nn.Module):
    """A step over tensors it owns as parameters (so a training trace differentiates them)."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        *shapes: tuple[int, ...],
        channels_last: bool = False,
        modules: dict[str, nn.Module] | None = None,
    ):
        super().__init__()
        self.fn = fn
        self.inputs = nn.ParameterList()
        for shape in shapes:
            t = torch.randn(shape)
            if channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            self.inputs.append(nn.Parameter(t))
        self.layers = nn.ModuleDict(modules or {})

    def forward(self, _unused: torch.Tensor | None = None) -> torch.Tensor:
        return self.fn(self, *self.inputs)


def _rows(scale: float, full: int) -> int:
    return max(int(full * scale), 8)


def _side(scale: float, full: int) -> int:
    return full if scale >= SMOKE else max(full // 8, 8)


def _fused(kind: str, scale: float) -> nn.Module:
    from ...kernels import (
        BatchNormAct2d,
        GlobalResponseNorm,
        GroupNormAct,
        LayerNormGELU,
        MaxPool2d,
        SoftmaxDropout,
    )
    from ...kernels import dropout_add_layer_norm as dal

    if kind == "norm_act":
        return _Workload(
            lambda m, x: m.layers["op"](x),
            (_rows(scale, 32768), 4096),
            modules={"op": LayerNormGELU(4096)},
        )
    if kind == "batch_norm_act":  # a smoke test's scale shrinks every dimension
        c, hw = (256, 56) if scale >= SMOKE else (16, 8)
        shape = (max(int(64 * scale), 2), c, hw, hw)
        return _Workload(
            lambda m, x, r: m.layers["op"](x, r),
            shape,
            shape,
            channels_last=True,
            modules={"op": BatchNormAct2d(c)},
        )
    if kind == "max_pool":  # ResNet's stem pool
        shape = (max(int(64 * scale), 2), 64, _side(scale, 112), _side(scale, 112))
        return _Workload(
            lambda m, x: m.layers["op"](x),
            shape,
            channels_last=True,
            modules={"op": MaxPool2d(3, 2, 1)},
        )
    if kind == "grn":  # ConvNeXt-V2-Tiny's first-stage GRN: the MLP's 4x width, channels last
        shape = (max(int(64 * scale), 2), _side(scale, 56), _side(scale, 56), 384)
        return _Workload(
            lambda m, x: m.layers["op"](x), shape, modules={"op": GlobalResponseNorm(384)}
        )
    if kind == "group_norm":  # ResNet-50-GN's first-stage GroupNorm(32, 256) then ReLU, NCHW
        shape = (max(int(64 * scale), 2), 256, _side(scale, 56), _side(scale, 56))
        return _Workload(
            lambda m, x: m.layers["op"](x),
            shape,
            modules={"op": GroupNormAct(32, 256, activation="relu")},
        )
    if kind == "dropout_add_norm":  # BERT-base's block output at 32 x 512 tokens
        norm = nn.LayerNorm(768, eps=1e-12)
        return _Workload(
            lambda m, x, r: dal(x, r, m.layers["op"].weight, m.layers["op"].bias, 1e-12, p=0.1),
            (_rows(scale, 16384), 768),
            (_rows(scale, 16384), 768),
            modules={"op": norm},
        )
    return _Workload(
        lambda m, x: m.layers["op"](x),
        (_rows(scale, 65536), 1024),
        modules={"op": SoftmaxDropout(0.1)},
    )


def _embedding(scale: float, batch: int) -> _Workload:
    """Embedding(30522, 768) (BERT's vocabulary) over batch x 512 token ids."""
    ids = torch.randint(0, 30522, (max(int(batch * scale), 1), 512))
    w = _Workload(lambda m, table: F.embedding(m.ids, table), (30522, 768))
    w.register_buffer("ids", ids)
    return w


def _layer_norm(scale: float, width: int) -> _Workload:
    """LayerNorm(width) over as many rows as make 32768 x 4096 elements."""
    return _Workload(
        lambda m, x: m.layers["ln"](x),
        (_rows(scale, 32768 * 4096 // width), width),
        modules={"ln": nn.LayerNorm(width)},
    )


def _batch_norm(scale: float, c: int, h: int, w: int, channels_last: bool = False) -> _Workload:
    return _Workload(
        lambda m, x: m.layers["bn"](x),
        (_rows(scale, 64), c, _side(scale, h), _side(scale, w)),
        channels_last=channels_last,
        modules={"bn": nn.BatchNorm2d(c)},
    )


def _depthwise(scale: float, c: int, side: int, k: int, channels_last: bool) -> _Workload:
    conv = nn.Conv2d(c, c, k, padding=k // 2, groups=c, bias=False)
    return _Workload(
        lambda m, x: m.layers["dw"](x),
        (_rows(scale, 64), c, _side(scale, side), _side(scale, side)),
        channels_last=channels_last,
        modules={"dw": conv},
    )


def _layer_norm_weight_grad(scale: float) -> nn.Module:
    from ..memory import LayerNormWeightGrad  # it imports this module

    return LayerNormWeightGrad(_rows(scale, 50176), 192)


def _downsample(scale: float) -> _Workload:
    """ConvNeXt-T's first downsampling, Conv2d(96, 192, 2, stride 2), on its input."""
    conv = nn.Conv2d(96, 192, 2, stride=2, bias=False)
    shape = (_rows(scale, 64), 96, _side(scale, 56), _side(scale, 56))
    return _Workload(
        lambda m, x: m.layers["conv"](x), shape, channels_last=True, modules={"conv": conv}
    )


def _broadcast_mul(scale: float) -> _Workload:
    """x * s, s of shape (B, 1, 1, 1): DropPath's keep mask, a buffer (no gradient of its own)."""
    side = _side(scale, 56)
    w = _Workload(lambda m, x: x * m.s, (_rows(scale, 64), side, side, 96))
    w.register_buffer("s", torch.rand(_rows(scale, 64), 1, 1, 1))
    return w


def _narrow_mlp(scale: float) -> _Workload:
    """Linear(96, 384) then Linear(384, 96), no bias, over 64 x 56 x 56 rows."""
    mlp = nn.Sequential(nn.Linear(96, 384, bias=False), nn.Linear(384, 96, bias=False))
    return _Workload(
        lambda m, x: m.layers["mlp"](x), (_rows(scale, 200704), 96), modules={"mlp": mlp}
    )


def _window_partition(m: _Workload, x: torch.Tensor) -> torch.Tensor:
    """Swin's: (B, H, W, C) into 7x7 windows, (B x windows, 7, 7, C); a 6-D permuted copy."""
    b, h, w, c = x.shape
    x = x.view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5)
    return x.contiguous().view(-1, 7, 7, c)


def _copies(scale: float, kind: str) -> _Workload:
    side = 56 if scale >= SMOKE else 14
    if kind == "permuted":
        return _Workload(_window_partition, (_rows(scale, 64), side, side, 96))
    if kind == "transposed":  # NCHW to NHWC, as a LayerNorm over a conv's channels needs
        return _Workload(
            lambda m, x: x.permute(0, 2, 3, 1).contiguous(), (_rows(scale, 64), 96, side, side)
        )
    if kind == "transposed_nchw":  # NHWC to NCHW: a channels_last-strided gradient made NCHW
        return _Workload(
            lambda m, x: x.permute(0, 3, 1, 2).contiguous(), (_rows(scale, 64), side, side, 96)
        )
    return _Workload(  # Swin's shifted windows: two dimensions rolled
        lambda m, x: torch.roll(x, (-3, -3), (1, 2)), (_rows(scale, 64), side, side, 96)
    )


def _kv_cat(scale: float) -> _Workload:
    """A key/value cache's first append as transformers' DynamicCache makes it: a (B, T, H, D)
    projection viewed as (B, H, T, D), concatenated onto an empty cache (GPT-2's 12 heads of 64)."""
    t = 1024 if scale >= SMOKE else 64

    def append(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        heads = x.transpose(1, 2)
        empty = heads.new_empty(heads.shape[0], heads.shape[1], 0, heads.shape[3])
        return torch.cat([empty, heads], dim=-2)

    return _Workload(append, (_rows(scale, 32), t, 12, 64))


def _qkv_stack(scale: float) -> _Workload:
    """The backward of `qkv.unbind(0)` as timm's attention makes it: three (B, T, H, D) tensors
    viewed as (B, H, T, D), stacked (ViT-B/16's 12 heads of 64 over 197 tokens)."""
    t = 197 if scale >= SMOKE else 16

    def stack(m: nn.Module, *parts: torch.Tensor) -> torch.Tensor:
        return torch.stack([p.transpose(1, 2) for p in parts], dim=0)

    shape = (_rows(scale, 64), t, 12, 64)
    return _Workload(stack, shape, shape, shape)


def _s2d_fold(scale: float) -> nn.Module:
    """s2d-stem's input fold for ResNet's 7x7/2 stem, on an input it owns (forward only)."""
    from ...models.space_to_depth import SpaceToDepthFold

    return _Workload(
        lambda m, x: m.layers["fold"](x),
        (_rows(scale, 64), 3, _side(scale, 224), _side(scale, 224)),
        channels_last=True,
        modules={"fold": SpaceToDepthFold((7, 7), 2, (3, 3), 16)},
    )


def _channel_sum(scale: float, rows: int, channels: int, layout: str) -> nn.Module:
    """A sum of `rows` x `channels` down to one value a channel: over the rows of a matrix
    ("columns", a bias gradient) or over batch and positions of 64 NCHW images ("NCHW")."""
    if layout == "columns":
        return _Workload(lambda m, x: x.sum(0), (_rows(scale, rows), channels))
    side = _side(scale, round((rows / 64) ** 0.5))
    return _Workload(lambda m, x: x.sum((0, 2, 3)), (64, channels, side, side))
