"""The GPU correlation script's attribution and rank correlation, checked on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "trace"))
from _attribution import (
    BACKWARD,
    module_ranges,
    node_modules,
    ranks,
    spearman,
    time_per_module,
)


def test_forward_and_backward_time_land_on_their_modules():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Sequential(nn.Linear(256, 32)))
    x = torch.randn(128, 64)
    with module_ranges(net), profile(activities=[ProfilerActivity.CPU]) as prof:
        y = net(x)
        y.backward(torch.ones_like(y))
    per_module, unattributed, total = time_per_module(prof.events(), device=False)
    assert {"0", "1", "2.0"} <= set(per_module)
    assert sum(per_module.values()) + unattributed == pytest.approx(total)
    names = [e.name for e in prof.events()]
    assert any(n.startswith("autograd::engine::evaluate_function: AddmmBackward0") for n in names)
    assert unattributed < 0.5 * total  # the seed (ones_like) and gradient accumulation only


class _Embeddings(nn.Module):
    """GPT-2's embedding block: ops on the token ids (no autograd node) before the lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(5000, 128), nn.Embedding(256, 128)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.view(-1, ids.shape[-1])
        positions = torch.arange(ids.shape[-1]).unsqueeze(0)
        return self.wte(ids) + self.wpe(positions)


def test_an_embeddings_backward_lands_on_the_embedding_not_its_parent():
    net = _Embeddings()
    ids = torch.randint(0, 5000, (4, 256))
    with module_ranges(net), profile(activities=[ProfilerActivity.CPU]) as prof:
        y = net(ids)
        y.backward(torch.ones_like(y))
    events = prof.events()
    nodes = [e for e in events if e.name == BACKWARD + "EmbeddingBackward0"]
    seq_module = node_modules(events)
    assert sorted(seq_module[e.sequence_nr] for e in nodes) == ["wpe", "wte"]
    per_module, _, _ = time_per_module(events, device=False)
    assert {"wte", "wpe"} <= set(per_module)


def test_ranks_average_ties_and_spearman_matches_the_textbook():
    assert list(ranks(np.array([10.0, 30.0, 20.0, 20.0]))) == [1, 4, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # 1 - 6*2/(4*15)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
