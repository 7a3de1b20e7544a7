"""What reaches a compiled step's graphs from outside: the model's inputs and, in training, a
gradient for each output that requires grad (`Trace.boundary_bytes`)."""

from __future__ import annotations

import torch
from torch import nn

from gpushape.tracing.tracer import trace


class _TwoOutputs(nn.Module):
    """A loss and the logits it came from, as a Hugging Face model with labels returns them."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(16, 100, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor):
        logits = self.lm_head(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return loss, logits


def test_inputs_and_every_differentiable_outputs_gradient_cross_into_the_graphs():
    model = _TwoOutputs().to(torch.bfloat16)
    x = torch.empty(4, 8, 16, dtype=torch.bfloat16)
    labels = torch.zeros(4, 8, dtype=torch.int64)
    t = trace(model, (x, labels), train=True)
    inputs = 4 * 8 * 16 * 2 + 4 * 8 * 8
    assert t.boundary_bytes == inputs + 4 + 4 * 8 * 100 * 2  # fp32 loss, bf16 logits
    assert trace(model, (x, labels)).boundary_bytes == inputs  # inference: no gradients
