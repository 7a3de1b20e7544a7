"""A LLaMA decoder, laid out like Hugging Face's LlamaForCausalLM (`model.layers.0.mlp.up_proj`).

The `llama-7b` entry is LLaMA-1 7B: 32 layers, width 4096, 32 heads, SwiGLU MLP 11008, vocab
32000, RMSNorm, rotary position embeddings, no biases, untied LM head: 6,738,415,616
parameters. It exists to show a 7B model auditing on the meta device, where building it costs
no memory; on a real device it would allocate all of it. Small configs of the same class
(`LLAMA_TINY`, or `create_model("llama-7b", layers=2, hidden=256, ...)`) run real forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._build import build, check_divides, check_seq_len, configure, init_normal_, token_input
from .registry import ModelAndInputs, register_model


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    mlp_hidden: int = 11008
    max_seq_len: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


LLAMA_7B = LlamaConfig()
LLAMA_TINY = LlamaConfig(
    vocab_size=512, hidden=256, layers=2, heads=4, mlp_hidden=688, max_seq_len=128
)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, with the statistics in float32 whatever the input dtype."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_seq_len (buffers, not saved in checkpoints)."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (S, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (S, D): rotate-half layout, as in HF
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:seq_len], self.sin[:seq_len]  # 2 x (T, D)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position: pairs (i, i + D/2) turn by the position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.q_proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.o_proj = nn.Linear(config.hidden, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        shape = (B, T, self.heads, C // self.heads)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(config.mlp_hidden, config.hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.rms_norm_eps)
        head_dim = config.hidden // config.heads
        self.rotary_emb = RotaryEmbedding(head_dim, config.max_seq_len, config.rope_theta)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary_emb(input_ids.shape[1])
        x = self.embed_tokens(input_ids)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig = LLAMA_7B) -> None:
        super().__init__()
        check_divides("llama", config.hidden, config.heads)
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) int64 -> next-token logits (B, T, vocab)."""
        return self.lm_head(self.model(input_ids))


def init_llama_(model: LlamaForCausalLM) -> None:
    """N(0, 0.02) for projections and embeddings; RMSNorm weights at one."""
    init_normal_(model, std=0.02)
    for sub in model.modules():
        if isinstance(sub, RMSNorm):
            nn.init.ones_(sub.weight)


@register_model(
    "llama-7b",
    default_batch=1,
    description="LLaMA-7B decoder (RMSNorm, RoPE, SwiGLU), 6.7B params: audit on the meta device",
)
def llama_7b(
    *,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
    seq_len: int | None = None,
    **options: Any,
) -> ModelAndInputs:
    config = configure("llama-7b", LLAMA_7B, options)
    seq_len = check_seq_len("llama-7b", seq_len or config.max_seq_len, config.max_seq_len)
    model = build(lambda: LlamaForCausalLM(config), dtype=dtype, device=device, init=init_llama_)
    return model, (token_input((batch, seq_len), config.vocab_size, device),)
