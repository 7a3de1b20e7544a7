"""BERT-base with a masked-language-model head, laid out like Hugging Face's BertForMaskedLM.

Module names follow HF (`bert.encoder.layer.0.attention.self.query`, `cls.predictions.decoder`),
so an HF checkpoint's tensors map one to one. 109,514,298 parameters (the decoder is tied to the
word embeddings). The textbook baseline: three separate Q/K/V projections, and attention either
through `scaled_dot_product_attention` (`attention="sdpa"`, default) or written out by hand
(`attention="manual"`: softmax(QK^T/sqrt(d)), dropout on the probabilities, then @V).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GpushapeError
from ._build import build, check_divides, check_seq_len, configure, init_normal_, token_input
from .registry import ModelAndInputs, register_model


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    vocab_size: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    mlp_hidden: int = 3072
    max_seq_len: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1  # hidden states and attention probabilities alike, as in BERT
    attention: Literal["sdpa", "manual"] = "sdpa"


BERT_BASE = BertConfig()


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.position_embeddings = nn.Embedding(config.max_seq_len, config.hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden)
        self.LayerNorm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_type_ids)  # (B, T, C)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.head_dim = config.hidden // config.heads
        self.mode = config.attention
        self.query = nn.Linear(config.hidden, config.hidden)
        self.key = nn.Linear(config.hidden, config.hidden)
        self.value = nn.Linear(config.hidden, config.hidden)
        self.dropout = nn.Dropout(config.dropout)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        if self.mode == "manual":
            out = self._manual(q, k, v, mask)
        else:
            p = self.dropout.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        B, H, T, D = out.shape
        return out.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)

    def _manual(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return probs @ v  # (B, H, T, D)


class BertSelfOutput(nn.Module):
    """Projection back to the residual stream, dropout, residual add, post-LayerNorm."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden)
        self.LayerNorm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden, config.mlp_hidden)
        self.intermediate_act_fn = nn.GELU()  # exact (erf) GELU, as BERT was trained

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.mlp_hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertModel(nn.Module):
    """Embeddings and encoder; no pooler (the MLM head does not use one)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        mask = None
        if attention_mask is not None:  # (B, T), 1 = attend -> (B, 1, 1, T) boolean
            mask = attention_mask.bool()[:, None, None, :]
        return self.encoder(self.embeddings(input_ids, token_type_ids), mask)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden, config.hidden)
        self.transform_act_fn = nn.GELU()
        self.LayerNorm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden, config.vocab_size)  # weight tied by the owner
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # one output bias, one fused addmm (as in HF)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))  # (B, T, vocab)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictions(x)


class BertForMaskedLM(nn.Module):
    def __init__(self, config: BertConfig = BERT_BASE) -> None:
        super().__init__()
        check_divides("bert", config.hidden, config.heads)
        if config.attention not in ("sdpa", "manual"):
            raise GpushapeError(
                f"bert: attention must be 'sdpa' or 'manual', got {config.attention!r}"
            )
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertOnlyMLMHead(config)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        """input_ids (B, T) int64 -> MLM logits (B, T, vocab)."""
        return self.cls(self.bert(input_ids, token_type_ids, attention_mask))


@register_model(
    "bert-base",
    default_batch=8,
    description="BERT-base encoder + MLM head (HF layout, separate Q/K/V), 110M params, seq 512",
)
def bert_base(
    *,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
    seq_len: int | None = None,
    **options: Any,
) -> ModelAndInputs:
    config = configure("bert-base", BERT_BASE, options)
    seq_len = check_seq_len("bert-base", seq_len or config.max_seq_len, config.max_seq_len)
    model = build(lambda: BertForMaskedLM(config), dtype=dtype, device=device, init=init_normal_)
    return model, (token_input((batch, seq_len), config.vocab_size, device),)
