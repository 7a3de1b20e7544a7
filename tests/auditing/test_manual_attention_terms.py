"""manual-attention reads the shapes and the mask terms of attention written with baddbmm (Bloom's
ALiBi: the bias is baddbmm's first input, the factors its next two) and with a key-wise bias
besides a (T, T) mask (MPT): both reach SDPA as an additive mask, so flash's is_causal=True is
never offered for them; a lone (T, T) mask still gets that hint."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gpushape
from gpushape.hardware import get_gpu
from gpushape.models import resolve_model

T, HEADS, D = 256, 4, 32


class Scores(nn.Module):
    """softmax(QK^T / sqrt(d) + terms) V on (B*H, T, d) tensors; `alibi` adds a per-head bias
    over keys through baddbmm (as Bloom does) or through an add (as MPT does); `causal` adds a
    (T, T) mask."""

    def __init__(self, *, alibi: str | None, causal: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(HEADS * D, 3 * HEADS * D)
        self.alibi, self.causal = alibi, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        q, k, v = (
            t.reshape(B, T, HEADS, D).transpose(1, 2).reshape(B * HEADS, T, D)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        bias = torch.zeros(B * HEADS, 1, T, dtype=x.dtype, device=x.device)
        if self.alibi == "baddbmm":
            scores = bias.baddbmm(q, k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(D))
        else:
            scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(D)
            if self.alibi == "add":
                scores = scores + bias
        if self.causal:
            scores = scores + torch.zeros(T, T, dtype=x.dtype, device=x.device)
        out = torch.bmm(torch.softmax(scores, dim=-1), v)
        return out.reshape(B, HEADS, T, D).transpose(1, 2).reshape(B, T, HEADS * D)


def _finding(model: nn.Module):
    model = model.to(torch.bfloat16)
    x = torch.empty(8, T, HEADS * D, dtype=torch.bfloat16, device="meta")
    report = gpushape.audit(
        model, (x,), gpu=get_gpu("h200"), train=True, rules=["manual-attention"]
    )
    (f,) = report.findings
    return f


@pytest.mark.parametrize("alibi", ["baddbmm", "add"])
def test_an_added_bias_is_a_mask_and_never_the_causal_one(alibi):
    f = _finding(Scores(alibi=alibi, causal=True))
    e = f.evidence
    assert (e["q_len"], e["kv_len"], e["head_dim"], e["batch_x_heads"]) == (T, T, D, 8 * HEADS)
    assert e["mask"] and e["fused_kernel"] == "efficient"
    assert "time_fused_if_causal_s" not in e and "is_causal" not in f.message
    assert f"{T}x{T} score matrix" in f.message


def test_baddbmm_without_a_mask_term_reads_its_factors():
    f = _finding(Scores(alibi="baddbmm", causal=False))
    assert (f.evidence["q_len"], f.evidence["kv_len"], f.evidence["head_dim"]) == (T, T, D)
    assert f.evidence["mask"]  # the bias is added: SDPA takes it as attn_mask


def test_a_lone_square_mask_keeps_the_causal_hint():
    f = _finding(Scores(alibi=None, causal=True))
    assert f.evidence["mask"] and "time_fused_if_causal_s" in f.evidence
    assert "if the mask is causal, is_causal=True" in f.message


def test_no_mask_term_prices_flash():
    f = _finding(Scores(alibi=None, causal=False))
    assert not f.evidence["mask"] and f.evidence["fused_kernel"] == "flash"


def test_bloom_says_transformers_has_no_sdpa_path():
    pytest.importorskip("transformers")
    spec = "hf:bloom?n_layer=1&hidden_size=128&n_head=4&vocab_size=1000&seq=256"
    r = resolve_model(spec, batch=2)
    report = gpushape.audit(r.model, r.example_inputs, gpu="h200", dtype="bf16", train=True)
    (f,) = [f for f in report.findings if f.rule == "manual-attention"]
    assert (f.evidence["q_len"], f.evidence["kv_len"], f.evidence["head_dim"]) == (256, 256, 32)
    assert "is_causal" not in f.message
    assert "transformers has no sdpa path for BloomForCausalLM" in f.message
