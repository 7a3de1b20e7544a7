"""The data sets and models of the convergence tests (harness: _convergence.py): fixed
synthetic tasks the models can learn, and small models that build with PyTorch's modules
(`fused=False`) or gpushape's kernels (`fused=True`) under the same state_dict keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpushape.kernels import (
    AddLayerNorm,
    BatchNormAct2d,
    FusedQKV,
    GlobalResponseNorm,
    LayerNormGELU,
    RMSNorm,
    SoftmaxDropout,
)
from gpushape.kernels.attention.softmax_dropout import draw_seed, dropout_keep_mask

from ._convergence import SEED, Batch

# ---- data: fixed synthetic tasks the models can learn ---------------------------------------


def sequence_regression(
    *, d: int = 32, batch: int = 4, seq: int = 16, n_batches: int = 2, mix: bool = False
) -> list[Batch]:
    """(x, target) batches, x (batch, seq, d) ~ N(0, 1), target = a fixed random 2-layer tanh
    network of x; with `mix` its causal running mean over the sequence (a task for attention)."""
    g = torch.Generator().manual_seed(SEED + 2)
    w1 = torch.randn(d, 2 * d, generator=g) / d**0.5
    w2 = torch.randn(2 * d, d, generator=g) / (2 * d) ** 0.5
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, seq, d, generator=g)
        target = torch.tanh(x @ w1) @ w2
        if mix:
            target = target.cumsum(1) / torch.arange(1, seq + 1).view(1, seq, 1)
        out.append((x, target))
    return out


def image_classification(
    *, batch: int = 8, channels: int = 3, size: int = 8, classes: int = 4, n_batches: int = 2
) -> list[Batch]:
    """(x, label) batches, x (batch, channels, size, size); labels from a fixed random linear
    map of the image."""
    g = torch.Generator().manual_seed(SEED + 3)
    w = torch.randn(channels * size * size, classes, generator=g)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, channels, size, size, generator=g)
        out.append((x, (x.flatten(1) @ w).argmax(1)))
    return out


# ---- models: each with the same state_dict keys fused or not --------------------------------


class NormGeluMLP(nn.Module):
    """Two Linear -> LayerNorm -> GELU layers and a Linear head; fused: LayerNormGELU."""

    def __init__(self, fused: bool, d: int = 32, hidden: int = 64, approximate: str = "none"):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, hidden)
        if fused:
            self.norm1 = LayerNormGELU(hidden, approximate=approximate)
            self.norm2 = LayerNormGELU(hidden, approximate=approximate)
            self.act = nn.Identity()
        else:
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.act = nn.GELU(approximate=approximate)
        self.head = nn.Linear(hidden, d)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.norm1(self.fc1(x)))
        h = self.act(self.norm2(self.fc2(h)))
        return self.head(h)


class ResidualNormStack(nn.Module):
    """Post-add LayerNorm blocks: s = mlp(y) + s; y = LayerNorm(s). The first block's fused
    AddLayerNorm has both outputs used (y by the next MLP, s by the next add), so its backward
    takes dy and ds; the last block's s is unused (dy alone)."""

    def __init__(self, fused: bool, d: int = 32, hidden: int = 64, blocks: int = 2):
        super().__init__()
        self.fused = fused
        self.inp = nn.Linear(d, d)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
            for _ in range(blocks)
        )
        norm = AddLayerNorm if fused else nn.LayerNorm
        self.norms = nn.ModuleList(norm(d) for _ in range(blocks))
        self.head = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        s = self.inp(x)
        y = s
        for mlp, norm in zip(self.mlps, self.norms):
            if self.fused:
                y, s = norm(mlp(y), s)
            else:
                s = mlp(y) + s
                y = norm(s)
        return self.head(y)


class RMSNormBlock(nn.Module):
    """A pre-norm residual MLP block and a normed head (LLaMA-style); fused: gpushape's
    RMSNorm, else torch.nn.RMSNorm, both with eps 1e-6."""

    def __init__(self, fused: bool, d: int = 32, hidden: int = 64):
        super().__init__()
        norm = RMSNorm if fused else nn.RMSNorm
        self.inp = nn.Linear(d, d)
        self.norm1, self.norm2 = norm(d, eps=1e-6), norm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, d))
        self.head = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        h = h + self.mlp(self.norm1(h))
        return self.head(self.norm2(h))


class _BatchNormAct(nn.BatchNorm2d):
    """The reference: nn.BatchNorm2d, then + residual, then ReLU or nothing (state_dict of a
    BatchNorm2d)."""

    def __init__(self, num_features: int, activation: str):
        super().__init__(num_features)
        self.activation = activation

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = super().forward(x)
        y = y if residual is None else y + residual
        return torch.relu(y) if self.activation == "relu" else y


class SmallResNet(nn.Module):
    """A stride-2 conv-BN-act stem and a residual conv-BN-add-act, global average pool, a
    linear classifier, in channels_last (the layout convolutions take on tensor cores); fused:
    BatchNormAct2d, the second with its residual input. `activation` is the kernel's: "relu",
    or "none" with a SiLU after each norm (outside the kernel, in both models). 12 channels:
    the ReLU mask's second byte (8 channels a byte) is half used."""

    def __init__(self, fused: bool, activation: str, channels: int = 12, classes: int = 4):
        super().__init__()
        c = channels
        self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        if fused:
            self.bn1, self.bn2 = (BatchNormAct2d(c, activation=activation) for _ in range(2))
        else:
            self.bn1, self.bn2 = (_BatchNormAct(c, activation) for _ in range(2))
        self.act = nn.SiLU() if activation == "none" else nn.Identity()
        self.head = nn.Linear(c, classes)
        self.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.bn1(self.stem(x.contiguous(memory_format=torch.channels_last))))
        h = self.act(self.bn2(self.conv(h), h))
        return self.head(h.mean((2, 3)))


class _TorchGRN(nn.Module):
    """timm's GlobalResponseNorm (channels last) as PyTorch ops: weight and bias zeros."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.zeros(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        x_g = x.norm(p=2, dim=(1, 2), keepdim=True)
        x_n = x_g / (x_g.mean(dim=-1, keepdim=True) + 1e-6)
        return x + torch.addcmul(self.bias, self.weight, x * x_n)


class GRNConvNet(nn.Module):
    """A convolution stem, then ConvNeXt-V2's MLP over (N, H, W, C): Linear, GELU, GRN,
    Linear; a linear classifier over every pixel (the labels are a linear map of the image).
    fused: gpushape's GRN."""

    def __init__(
        self, fused: bool, channels: int = 12, hidden: int = 24, classes: int = 4, size: int = 8
    ):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.fc1, self.act = nn.Linear(channels, hidden), nn.GELU()
        self.grn = GlobalResponseNorm(hidden) if fused else _TorchGRN(hidden)
        self.fc2 = nn.Linear(hidden, channels)
        self.head = nn.Linear(channels * size * size, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x).permute(0, 2, 3, 1)
        h = h + self.fc2(self.grn(self.act(self.fc1(h))))
        return self.head(h.flatten(1))


class SoftmaxThenDropout(nn.Module):
    """The reference for SoftmaxDropout: F.softmax, then dropout as torch applies it (kept
    values times 1 / (1 - p)) with the mask the fused op draws: the seed is drawn as the op
    draws it (`draw_seed`, one per call while dropping) and its mask regenerated
    (`dropout_keep_mask`), so after the same torch.manual_seed both drop the same elements."""

    def __init__(self, p: float, scale: float):
        super().__init__()
        self.p, self.scale = p, scale

    def forward(self, x: Tensor, is_causal: bool = False) -> Tensor:
        z = x * self.scale
        if is_causal:
            allowed = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril()
            z = z.masked_fill(~allowed, float("-inf"))
        s = torch.softmax(z, dim=-1)
        if not self.training or self.p == 0:
            return s
        keep = dropout_keep_mask(draw_seed(x.device), x.shape, self.p, x.device)
        return s * keep / (1 - self.p)


class CausalSelfAttention(nn.Module):
    """One causal multi-head attention layer written out (q k^T, softmax-dropout, times v) with
    a residual and a Linear head; fused: SoftmaxDropout."""

    def __init__(self, fused: bool, p: float, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        scale = self.head_dim**-0.5
        self.qkv, self.out, self.head = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn = SoftmaxDropout(p, scale) if fused else SoftmaxThenDropout(p, scale)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = self.attn(q @ k.transpose(-1, -2), is_causal=True)
        o = (a @ v).transpose(1, 2).reshape(b, t, d)
        return self.head(x + self.out(o))


class ThreeLinears(nn.Module):
    """q_proj, k_proj, v_proj as nn.Linear, heads split by view + transpose: (B, heads, T, D)."""

    def __init__(self, d: int, heads: int, kv_heads: int):
        super().__init__()
        self.head_dim = d // heads
        kv = kv_heads * self.head_dim
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, kv), nn.Linear(d, kv)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        return tuple(
            proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )


class GQAttention(nn.Module):
    """Causal grouped-query attention through scaled_dot_product_attention, with a residual and
    a Linear head; fused: FusedQKV, which loads the three Linears' state_dict."""

    def __init__(self, fused: bool, d: int = 32, heads: int = 2, kv_heads: int = 1):
        super().__init__()
        self.qkv = FusedQKV(d, heads, kv_heads) if fused else ThreeLinears(d, heads, kv_heads)
        self.out, self.head = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.head(x + self.out(o.transpose(1, 2).reshape(b, t, d)))
