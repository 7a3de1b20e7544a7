"""sdpa: a Hugging Face model loaded with eager attention switched to SDPA, checked, reversible;
the audit no longer raises manual-attention."""

from __future__ import annotations

import pytest
import torch

from gpushape.transforms import optimize, revert

transformers = pytest.importorskip("transformers")


def _eager_gpt2():
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def test_eager_attention_switched_checked_and_reverted():
    model = _eager_gpt2()
    ids = torch.randint(0, 128, (2, 64))
    model, report = optimize(model, (ids,), gpu="h200", dtype=torch.float32, transforms=["sdpa"])
    assert [c.transform for c in report.applied] == ["sdpa"]
    assert report.verified["sdpa"].passed
    assert model.config._attn_implementation == "sdpa"
    assert any(f.rule == "manual-attention" for f in report.before.findings)
    assert not any(f.rule == "manual-attention" for f in report.after.findings)
    model = revert(model)
    assert model.config._attn_implementation == "eager"


def test_picked_from_the_finding_and_twice_equals_once():
    model = _eager_gpt2()
    ids = torch.randint(0, 128, (2, 64))
    model, first = optimize(model, (ids,), gpu="h200", dtype=torch.float32)
    assert "sdpa" in {c.transform for c in first.applied}
    _, second = optimize(model, (ids,), gpu="h200", dtype=torch.float32, transforms=["sdpa"])
    assert not second.applied
