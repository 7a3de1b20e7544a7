"""optimize() rolls back a rewrite that the audit of the whole rewritten step predicts slower."""

from __future__ import annotations

import torch
from torch import nn

from gpushape import audit
from gpushape.transforms._optimize import _Guard


class Extra(nn.Module):
    """The same MLP with one more layer: more GPU work, more launches."""

    def __init__(self, extra: bool):
        super().__init__()
        self.a, self.b = nn.Linear(1024, 4096), nn.Linear(4096, 1024)
        self.c = nn.Linear(1024, 1024) if extra else nn.Identity()

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))))


def _guard(model, x):
    before = audit(model, (x,), "h200", dtype=torch.bfloat16, train=True)
    return _Guard(before, (x,), "h200", torch.bfloat16, True, "eager")


def test_a_slower_rewrite_is_named_and_a_faster_one_becomes_the_baseline():
    x = torch.randn(4096, 1024, device="meta")
    guard = _guard(Extra(extra=False), x)
    reason = guard.slower(Extra(extra=True))
    assert reason is not None and reason.startswith("predicted slower on this chip: step ")
    assert guard.slower(Extra(extra=False)) is None  # the same step: no change
    faster = _guard(Extra(extra=True), x)
    assert faster.slower(Extra(extra=False)) is None
    assert faster.step == _guard(Extra(extra=False), x).step  # now measured against that
