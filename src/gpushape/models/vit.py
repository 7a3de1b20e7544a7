"""ViT-B/16 at 224x224, laid out like timm's `vit_base_patch16_224`.

Module names follow timm (`patch_embed.proj`, `blocks.0.attn.qkv`, `head`). 86,567,656
parameters; a 1x3x224x224 forward is 17.6 GMACs. A 16x16/16 patch conv, a class token, learned
position embeddings, pre-norm blocks with one fused qkv projection and SDPA, exact GELU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GpushapeError
from ._build import build, check_divides, configure, float_input, init_normal_
from .registry import ModelAndInputs, register_model


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    image_size: int = 224
    patch_size: int = 16
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    mlp_hidden: int = 3072
    num_classes: int = 1000
    layer_norm_eps: float = 1e-6
    dropout: float = 0.0  # ViT-B/16 ImageNet recipes train without dropout


VIT_B16 = ViTConfig()


class PatchEmbed(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.proj = nn.Conv2d(3, config.hidden, kernel_size=p, stride=p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, C, H/p, W/p) -> (B, N, C)


class Attention(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.attn_drop_p = config.dropout
        self.proj = nn.Linear(config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.heads, C // self.heads)  # (B, N, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, D)
        p = self.attn_drop_p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden, config.mlp_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(config.mlp_hidden, config.hidden)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.mlp = Mlp(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig = VIT_B16) -> None:
        super().__init__()
        check_divides("vit", config.hidden, config.heads)
        if config.image_size % config.patch_size:
            raise GpushapeError(
                f"vit: patch size {config.patch_size} does not divide "
                f"image size {config.image_size}"
            )
        num_patches = (config.image_size // config.patch_size) ** 2
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, config.hidden))
        self.pos_drop = nn.Dropout(config.dropout)
        self.blocks = nn.Sequential(*(Block(config) for _ in range(config.layers)))
        self.norm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.hidden, config.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, S, S) -> class logits (B, num_classes), read from the class token."""
        x = self.patch_embed(images)  # (B, N, C)
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, C)
        x = self.pos_drop(torch.cat([cls, x], dim=1) + self.pos_embed)  # (B, N + 1, C)
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def init_vit_(model: VisionTransformer) -> None:
    """Truncated N(0, 0.02) for Linear weights and position embeddings, tiny class token."""
    init_normal_(model, std=0.02)
    for sub in model.modules():
        if isinstance(sub, nn.Linear):
            nn.init.trunc_normal_(sub.weight, std=0.02)
    nn.init.trunc_normal_(model.pos_embed, std=0.02)
    nn.init.normal_(model.cls_token, std=1e-6)


@register_model(
    "vit-b16",
    default_batch=32,
    description="ViT-B/16 (timm layout, fused qkv, SDPA), 86.6M params, 224x224 images",
)
def vit_b16(
    *, batch: int, dtype: torch.dtype, device: torch.device, **options: Any
) -> ModelAndInputs:
    config = configure("vit-b16", VIT_B16, options)
    model = build(lambda: VisionTransformer(config), dtype=dtype, device=device, init=init_vit_)
    size = config.image_size
    return model, (float_input((batch, 3, size, size), dtype, device),)
