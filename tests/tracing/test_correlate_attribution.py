"""The GPU correlation script's attribution and rank correlation, checked on the CPU."""

from __future__ import annotations

import json
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
    time_per_module_op,
)
from op_breakdown import base, report


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


def test_per_op_time_adds_up_to_the_modules_time_and_names_the_ops_that_ran():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 32))
    x = torch.randn(128, 64)
    with module_ranges(net), profile(activities=[ProfilerActivity.CPU]) as prof:
        y = net(x)
        y.backward(torch.ones_like(y))
    events = prof.events()
    per_module, _, _ = time_per_module(events, device=False)
    per_op = time_per_module_op(events, device=False)
    assert set(per_op) == set(per_module)
    for module, ops in per_op.items():
        assert sum(ops.values()) == pytest.approx(per_module[module])
    assert any(base(op) == "gelu_backward" for op in per_op["1"])
    assert any(base(op) == "mm" for op in per_op["0"])


def test_op_names_of_both_sides_fold_to_one_base():
    assert base("aten::cudnn_convolution") == base("aten.convolution.default (forward)")
    assert base("aten::add_") == base("aten.add.Tensor (backward)") == "add"
    assert base("aten::_efficient_attention_backward") == "attention_backward"
    assert base("aten._scaled_dot_product_flash_attention.default (forward)") == "attention"
    assert base("aten::__and__") == "__and__"  # dunder names keep their underscores


def test_the_breakdown_sets_predicted_beside_measured_by_base_op():
    result = {
        "model": "m",
        "batch": 2,
        "rows": [
            {"module": "a", "type": "Conv2d", "predicted_kernel_s": 1e-3, "measured_s": 3e-3},
            {"module": "b", "type": "Linear", "predicted_kernel_s": 2e-3, "measured_s": 2e-3},
        ],
        "ops": {
            "a": {
                "predicted_s": {"aten.convolution.default (forward)": 1e-3},
                "measured_s": {"aten::cudnn_convolution": 2e-3, "aten::copy_": 1e-3},
            },
            "b": {
                "predicted_s": {"aten.mm.default (forward)": 2e-3},
                "measured_s": {"aten::mm": 2e-3},
            },
        },
    }
    lines = report(result, modules=1, top=5)
    conv = next(line for line in lines if line.strip().startswith("convolution"))
    assert conv.split()[1:] == ["2.000", "1.000", "0.50"]
    copy = next(line for line in lines if line.strip().startswith("copy "))
    assert copy.split()[-1] == "0.00"
    assert any(line.strip().startswith("a (Conv2d)") for line in lines)
    assert "no per-op data" in report({"model": "x", "rows": []}, 1, 1)[0]


def test_the_breakdown_reads_a_results_file_and_names_a_bad_one(tmp_path, capsys):
    from op_breakdown import main

    result = {
        "model": "m",
        "batch": 2,
        "rows": [{"module": "a", "type": "Linear", "predicted_kernel_s": 1e-3, "measured_s": 2e-3}],
        "ops": {"a": {"predicted_s": {"aten.mm.default (forward)": 1e-3}, "measured_s": {}}},
    }
    path = tmp_path / "correlate.json"
    path.write_text(json.dumps({"environment": {}, "results": [result]}))
    assert main([str(path), "--models", "m"]) == 0
    assert "m (batch 2): ops by measured ms a step" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "op_breakdown.py: cannot read" in capsys.readouterr().err
