"""GPT-2 small (124M), laid out like Hugging Face's GPT2LMHeadModel but with nn.Linear.

Module names follow HF (`transformer.h.0.attn.c_attn`, `lm_head`); HF stores these weights as
Conv1D, i.e. transposed relative to nn.Linear. 124,439,808 parameters with the LM head tied to
the token embedding. Pre-norm blocks, one fused c_attn projection (768 -> 3 x 768), causal
`scaled_dot_product_attention`, tanh-approximated GELU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._build import build, check_divides, check_seq_len, configure, init_normal_, token_input
from .registry import ModelAndInputs, register_model


@dataclass(frozen=True, kw_only=True)
class GPT2Config:
    vocab_size: int = 50257
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    mlp_hidden: int = 3072
    max_seq_len: int = 1024
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1  # embeddings, attention probabilities and residual branches


GPT2_SMALL = GPT2Config()


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.heads = config.heads
        self.c_attn = nn.Linear(config.hidden, 3 * config.hidden)  # q, k, v in one GEMM
        self.c_proj = nn.Linear(config.hidden, config.hidden)
        self.attn_dropout_p = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.heads, C // self.heads)  # (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)
        p = self.attn_dropout_p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(out))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.hidden, config.mlp_hidden)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(config.mlp_hidden, config.hidden)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Transformer(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden)
        self.wpe = nn.Embedding(config.max_seq_len, config.hidden)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))  # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, config: GPT2Config = GPT2_SMALL) -> None:
        super().__init__()
        check_divides("gpt2", config.hidden, config.heads)
        self.config = config
        self.transformer = GPT2Transformer(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) int64 -> next-token logits (B, T, vocab)."""
        return self.lm_head(self.transformer(input_ids))


def init_gpt2_(model: GPT2LMHeadModel) -> None:
    """N(0, 0.02) everywhere; residual output projections scaled by 1/sqrt(2 * layers) (GPT-2)."""
    init_normal_(model, std=0.02)
    resid_std = 0.02 / math.sqrt(2 * model.config.layers)
    for block in model.transformer.h:
        nn.init.normal_(block.attn.c_proj.weight, std=resid_std)
        nn.init.normal_(block.mlp.c_proj.weight, std=resid_std)


@register_model(
    "gpt2",
    default_batch=8,
    description="GPT-2 small decoder (fused c_attn, causal SDPA, tied head), 124M params, seq 1024",
)
def gpt2(
    *,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
    seq_len: int | None = None,
    **options: Any,
) -> ModelAndInputs:
    config = configure("gpt2", GPT2_SMALL, options)
    seq_len = check_seq_len("gpt2", seq_len or config.max_seq_len, config.max_seq_len)
    model = build(lambda: GPT2LMHeadModel(config), dtype=dtype, device=device, init=init_gpt2_)
    return model, (token_input((batch, seq_len), config.vocab_size, device),)
