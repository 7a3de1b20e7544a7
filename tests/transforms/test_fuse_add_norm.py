"""fuse-norm-act's add -> LayerNorm pattern: the sum and the norm become gpushape's
AddLayerNorm, which also hands the sum to its other users; checked and reverted, in a layer
written by hand and in Hugging Face's BERT."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpushape.kernels import AddLayerNorm
from gpushape.transforms import optimize, revert

from .nets import BertStyleLayer


class PreNorm(nn.Module):
    """A residual stream: the sum feeds the norm and the next residual add."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.f, self.norm, self.g = nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        s = x + self.f(x)
        return s + self.g(self.norm(s))


def _optimize(model, inputs):
    return optimize(model, inputs, gpu="h200", dtype=torch.float32, transforms=["fuse-norm-act"])


def _fused(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, AddLayerNorm)]


@pytest.mark.parametrize("build", [BertStyleLayer, PreNorm])
def test_add_then_layer_norm_fused_checked_and_reverted(build):
    torch.manual_seed(0)
    model = build()
    x = torch.randn(2, 16, 64)
    want = model(x)
    sd = copy.deepcopy(model.state_dict())
    model, report = _optimize(model, (x,))
    assert report.verified["fuse-norm-act"].passed, report.verified
    assert _fused(model) and all("add + LayerNorm" in c.detail for c in report.applied)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    assert list(model.state_dict()) == list(sd)
    _, again = _optimize(model, (x,))
    assert not again.applied  # twice equals once
    model = revert(model)
    assert not _fused(model) and type(model) is build
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k])


def test_the_finding_is_gone_after():
    model = PreNorm(768)
    x = torch.randn(8, 512, 768)
    model, report = _optimize(model, (x[:1, :8],))
    assert report.applied
    # the optimized model, audited at the full size, has no add -> LayerNorm left to fuse
    from gpushape import audit

    after = audit(model, (x,), "h200", dtype=torch.float32)
    assert not [f for f in after.findings if f.rule == "unfused-norm-act"]


def test_hugging_face_bert():
    pytest.importorskip("transformers")
    from .nets import tiny_bert

    model = tiny_bert()
    ids = torch.randint(0, 128, (2, 16))
    model, report = _optimize(model, (ids,))
    assert report.verified["fuse-norm-act"].passed
    fused = _fused(model)
    # each layer's attention output and feed-forward output: LayerNorm(hidden + input)
    assert {"encoder.layer.0.attention.output.LayerNorm", "encoder.layer.1.output.LayerNorm"} <= (
        set(fused)
    )
