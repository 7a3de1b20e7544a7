"""fp32-math says when the model itself casts a matmul's 16-bit operands to fp32 (GPT-Neo's
eager attention does, for its softmax): the finding stands, and its message names the cast."""

from __future__ import annotations

import torch
from torch import nn

from gpushape import audit


class UpcastScores(nn.Module):
    """q k^T in fp32 from bf16 projections, as GPT-Neo writes its attention scores."""

    def __init__(self, width: int = 256, upcast: bool = True):
        super().__init__()
        self.q, self.k, self.upcast = nn.Linear(width, width), nn.Linear(width, width), upcast

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        if self.upcast:
            q, k = q.to(torch.float32), k.to(torch.float32)
        return (q @ k.transpose(-1, -2)).softmax(-1).to(x.dtype)


def _fp32_math(model, x):
    report = audit(model, (x,), "h100", dtype=x.dtype, train=True)
    return [f for f in report.findings if f.rule == "fp32-math"]


def test_the_models_own_upcast_is_named():
    with torch.device("meta"):
        model = UpcastScores().to(torch.bfloat16)
    (found,) = _fp32_math(model, torch.empty(8, 512, 256, dtype=torch.bfloat16, device="meta"))
    assert found.evidence["upcast_by_model"] == 1
    assert "the model casts 1 of them from 16-bit to fp32 itself" in found.message


def test_a_model_in_fp32_is_not_said_to_upcast():
    with torch.device("meta"):
        model = UpcastScores(upcast=False)
    (found,) = _fp32_math(model, torch.empty(8, 512, 256, device="meta"))
    assert found.evidence["upcast_by_model"] == 0 and "itself" not in found.message
