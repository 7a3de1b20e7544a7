"""Small models for the audit tests: each is the textbook case of one rule, or of none."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from gpushape.kernels import AddLayerNorm


class GoodBlock(nn.Module):
    """Pre-norm transformer block as a performance engineer would write it: one fused QKV
    projection, scaled_dot_product_attention, widths multiples of 64, the residual add fused
    into the second norm (gpushape's AddLayerNorm returns the normalized sum and the sum)."""

    def __init__(self, width: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = AddLayerNorm(width)
        self.fc1 = nn.Linear(width, mlp)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(mlp, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, C // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, D)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        normed, x = self.norm2(self.proj(att.transpose(1, 2).reshape(B, T, C)), x)
        return x + self.fc2(self.act(self.fc1(normed)))


class GoodTransformer(nn.Module):
    def __init__(
        self,
        vocab: int = 8192,
        width: int = 768,
        heads: int = 12,
        mlp: int = 3072,
        layers: int = 4,
        seq: int = 1024,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(GoodBlock(width, heads, mlp) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class OneLinear(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class ConvBN(nn.Module):
    """conv -> BatchNorm -> ReLU, the ResNet unit."""

    def __init__(
        self, cin: int = 64, cout: int = 64, *, bias: bool = False, running_stats: bool = True
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(cout, track_running_stats=running_stats)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Stem(nn.Module):
    """ResNet's stem: 7x7 stride-2 conv, BatchNorm, ReLU, 3x3 stride-2 max pool (torch's, or
    gpushape's kernel with `fast_pool=True`)."""

    def __init__(self, *, fast_pool: bool = False) -> None:
        super().__init__()
        from gpushape.kernels import MaxPool2d

        self.conv = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(64)
        self.act = nn.ReLU(inplace=True)
        self.pool = MaxPool2d(3, 2, 1) if fast_pool else nn.MaxPool2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.act(self.bn(self.conv(x))))


class NormThen(nn.Module):
    """LayerNorm followed directly by GELU (fused=False), or by a Linear first (fused=True:
    the norm feeds a GEMM, the activation follows the GEMM)."""

    def __init__(self, width: int = 1024, *, act_after_norm: bool = True) -> None:
        super().__init__()
        self.act_after_norm = act_after_norm
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_after_norm:
            return self.fc(self.act(self.norm(x)))
        return self.act(self.fc(self.norm(x)))


class Attention(nn.Module):
    """Self-attention with separate or fused projections, SDPA or hand-written."""

    def __init__(
        self,
        width: int = 768,
        heads: int = 12,
        *,
        fused_qkv: bool = True,
        manual: bool = False,
        head_dim: int | None = None,
        dropout: float = 0.0,
        mask: bool = False,
    ) -> None:
        super().__init__()
        self.heads, self.manual, self.mask = heads, manual, mask
        self.head_dim = head_dim or width // heads
        inner = self.heads * self.head_dim
        self.fused = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(width, 3 * inner)
        else:
            self.query, self.key, self.value = (nn.Linear(width, inner) for _ in range(3))
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(inner, width)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        if self.fused:
            q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        else:
            q, k, v = (self._split(f(x)) for f in (self.query, self.key, self.value))
        if self.manual:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
            if self.mask:  # as Hugging Face's BERT does: fill where the mask says "no"
                keep = torch.ones(T, T, dtype=torch.bool, device=x.device)
                scores = scores.masked_fill(~keep, float("-inf"))
            out = self.drop(torch.softmax(scores, dim=-1)) @ v
        else:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device) if self.mask else None
            p = self.drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(out.transpose(1, 2).reshape(B, T, -1))


class SoftmaxThen(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(p) if p > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.softmax(x, dim=-1))


class ManyTiny(nn.Module):
    def __init__(self, layers: int = 40, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class MLPStack(nn.Module):
    """Repeated Linear -> GELU -> LayerNorm blocks (activation memory grows with the batch)."""

    def __init__(self, width: int = 4096, depth: int = 16) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
                for _ in range(depth)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class GeluMLP(nn.Module):
    """Linear -> GELU -> Linear; `written=True` writes the tanh GELU out as its formula, as
    Hugging Face's NewGELUActivation does (eight elementwise kernels)."""

    def __init__(self, d: int = 1024, written: bool = True):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.act = TanhGELUFormula() if written else nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class TanhGELUFormula(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


class TinyForMaskedLM(nn.Module):
    """A Hugging Face-shaped masked LM: an encoder (`base_model`), a head whose subtree holds the
    output embeddings, `config.vocab_size`, and the loss over every position with -100 ignored."""

    def __init__(self, vocab: int = 4096, hidden: int = 256):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab, use_return_dict=True)
        self.encoder = nn.Sequential(nn.Embedding(vocab, hidden), nn.Linear(hidden, hidden))
        self.cls = nn.Sequential(
            nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, vocab)
        )

    @property
    def base_model(self) -> nn.Module:
        return self.encoder

    def get_output_embeddings(self) -> nn.Module:
        return self.cls[3]

    def forward(self, input_ids, labels=None, return_dict=None):
        logits = self.cls(self.encoder(input_ids))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size), labels.view(-1))
        return (loss, logits) if loss is not None else logits


def hf_bert(implementation: str = "sdpa") -> nn.Module:
    """A Hugging Face BERT encoder (2 layers, width 256, 4 heads) with the attention
    implementation asked for; the test skips when transformers is missing."""
    import pytest

    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
        vocab_size=1024,
    )  # fmt: skip
    model = transformers.BertModel(config)
    if implementation != "sdpa":
        from gpushape.models.hf_masks import register_implementation

        register_implementation()
    model.set_attn_implementation(implementation)
    return model


def hf_gpt2(use_cache: bool = True) -> nn.Module:
    """A Hugging Face GPT-2 (2 layers, width 256, 4 heads, 1024 positions) with its key/value
    cache on or off; the test skips when transformers is missing."""
    import pytest

    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=256, n_head=4, vocab_size=1024, n_positions=1024, use_cache=use_cache
    )
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config)


class ManyOpsRmsNorm(nn.Module):
    """Hugging Face's RMSNorm as written: a chain of small eager ops (six each way), which
    Inductor fuses into one reduction's kernels."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class GlobalResponseNorm(nn.Module):
    """timm's GlobalResponseNorm (channels last), written out: what unfused-grn looks for."""

    def __init__(self, dim: int):
        super().__init__()
        self.eps = 1e-6
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x_g = x.norm(p=2, dim=(1, 2), keepdim=True)
        x_n = x_g / (x_g.mean(dim=-1, keepdim=True) + self.eps)
        return x + torch.addcmul(self.bias, self.weight, x * x_n)


class GRNMLP(nn.Module):
    """ConvNeXt-V2's MLP over (N, H, W, C): Linear, GELU, GRN, Linear; `fused`: gpushape's GRN."""

    def __init__(self, width: int = 96, fused: bool = False):
        super().__init__()
        from gpushape.kernels import GlobalResponseNorm as Fused

        self.fc1, self.act = nn.Linear(width, 4 * width), nn.GELU()
        self.grn = (Fused if fused else GlobalResponseNorm)(4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.fc2(self.grn(self.act(self.fc1(x))))


class GroupNormConv(nn.Module):
    """ResNet-GN's pattern: conv, GroupNorm(32), ReLU; `fused`: gpushape's GroupNormAct."""

    def __init__(self, width: int = 256, fused: bool = False):
        super().__init__()
        from gpushape.kernels import GroupNormAct

        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
        if fused:
            self.norm, self.act = GroupNormAct(32, width, activation="relu"), nn.Identity()
        else:
            self.norm, self.act = nn.GroupNorm(32, width), nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))
