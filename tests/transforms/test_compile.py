"""compile_model: torch.compile by preset, with dynamo's graphs, graph breaks and recompiles
reported; the explaining run leaves the model's buffers and the random generators as they were."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from gpushape.transforms import PRESETS, CompileReport, TransformError, compile_model


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Breaks(nn.Module):
    """A branch on a tensor's value read on the host: dynamo must break the graph there."""

    def __init__(self):
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(self.bn(self.a(x)))
        if y.sum().item() > 0:
            y = y * 2
        return self.b(y)


@functools.cache
def inductor_problem() -> str | None:
    """Why Inductor cannot compile on this machine (no C++ compiler, ...), or None."""
    try:
        fn = torch.compile(lambda x: (x * 2).sin())
        torch.testing.assert_close(fn(torch.ones(3)), (torch.ones(3) * 2).sin())
    except Exception as exc:
        return f"Inductor does not work here: {type(exc).__name__}: {str(exc)[:120]}"
    return None


def _needs_inductor():
    if inductor_problem():
        pytest.skip(inductor_problem())


def test_graph_break_reported_with_reason_and_place():
    model = Breaks()
    compiled, report = compile_model(model, (torch.randn(4, 8),))
    assert isinstance(report, CompileReport) and report.preset == "default"
    assert report.graphs == 2 and len(report.ops_per_graph) == 2
    assert all(n > 0 for n in report.ops_per_graph)
    [(reason, where)] = report.graph_breaks
    assert "item()" in reason and "\n" not in reason
    assert where.startswith("test_compile.py:") and where.endswith("in forward")
    assert any("graph break at test_compile.py" in line for line in report.lines())
    assert compiled._orig_mod is model


def test_no_break_is_one_graph():
    _, report = compile_model(Plain(), torch.randn(4, 8))  # a lone tensor is one input
    assert report.graphs == 1 and report.graph_breaks == []
    assert report.ops_per_graph == [3]  # linear, relu, linear
    assert report.lines()[1] == "1 graphs (0 breaks); ops per graph: 3"


def test_explaining_leaves_buffers_and_random_state_alone():
    model = Breaks().train()
    x = torch.randn(4, 8) + 3
    stats = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    compile_model(model, (x,))
    for before, after in zip(stats, model.buffers()):
        assert torch.equal(before, after)
    assert torch.equal(rng, torch.get_rng_state())


def test_explain_off_reports_no_graphs():
    _, report = compile_model(Plain(), (torch.randn(4, 8),), "max-autotune", explain=False)
    assert report.graphs is None and report.graph_breaks == []
    assert report.options == {"mode": "max-autotune"}


def test_presets_and_unknown_one():
    assert PRESETS["reduce-overhead"] == {"mode": "reduce-overhead"}
    assert set(PRESETS) == {
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    }
    with pytest.raises(TransformError, match="known: default, reduce-overhead, max-autotune"):
        compile_model(Plain(), (torch.randn(4, 8),), "fastest")


def test_inputs_the_model_cannot_take_are_one_line():
    with pytest.raises(TransformError, match="explain failed on the example inputs") as info:
        compile_model(Plain(), (torch.randn(4, 5),))
    assert "\n" not in str(info.value) and info.value.__cause__ is not None


def test_compiled_model_runs_and_counts_recompiles():
    _needs_inductor()
    model = Plain()
    compiled, report = compile_model(model, (torch.randn(4, 8),))
    assert report.count_recompiles() == 0
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert report.count_recompiles() == 0
    compiled(torch.randn(4, 8))  # same shape: the cached graph
    assert report.count_recompiles() == 0
    compiled(torch.randn(2, 3, 8))  # another rank: dynamo must compile again
    assert report.count_recompiles() == 1
    assert any(line.startswith("recompiled 1 times") for line in report.lines())
