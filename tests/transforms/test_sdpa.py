"""sdpa: a Hugging Face model loaded with eager attention switched to SDPA, checked, reversible;
the audit no longer raises manual-attention."""

from __future__ import annotations

import pytest
import torch

from gpushape.transforms import optimize, revert

pytest.importorskip("transformers")

from .nets import tiny_gpt2


def _eager_gpt2():
    return tiny_gpt2(attn="eager")


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
