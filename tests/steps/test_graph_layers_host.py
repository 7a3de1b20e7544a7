"""The host of an eager step whose layers graph-layers replays (steps/graph_layers_host.py): the
eager step's host less the captured layers' dispatch, plus each captured layer's replay at the
profile's rates; the loop's stage pricing falls back to graph mode without those rates."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gpushape.auditing.target import resolve_target
from gpushape.steps.graph_layers_host import graph_layers_host_s, layers_dispatch_s, rates_of
from gpushape.tracing.tracer import trace


class Stack(nn.Module):
    def __init__(self, blocks: int = 4):
        super().__init__()
        self.stem = nn.Linear(64, 64)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(blocks)
        )
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _spec(**rates):
    """The H200's profile with its host rates but graph-layers' replaced by `rates`."""
    spec = resolve_target("h200").spec
    host = {k: v for k, v in spec.achievable.host.items() if not k.startswith("graph_layer")}
    return spec.replace(achievable=dataclasses.replace(spec.achievable, host={**host, **rates}))


def test_without_the_rates_the_stage_is_not_priced_this_way():
    model, x = Stack(), torch.empty(32, 64, device="meta")
    bare = _spec()
    assert rates_of(bare) is None
    assert graph_layers_host_s(model, (x,), bare, ["blocks.0"], 1e-3) is None
    assert graph_layers_host_s(model, (x,), _spec(graph_layer=1e-4), [], 1e-3) is None


def test_captured_layers_trade_their_dispatch_for_their_replays():
    model, x = Stack(), torch.empty(32, 64, device="meta")
    spec = _spec(graph_layer=50e-6, graph_layer_param=2e-6)
    assert rates_of(spec) == (50e-6, 2e-6)
    captured = [f"blocks.{i}" for i in range(4)]
    traced = trace(model, (x,), train=True)
    inside = layers_dispatch_s(traced, spec.achievable.host, captured)
    one = layers_dispatch_s(traced, spec.achievable.host, captured[:1])
    assert inside == pytest.approx(4 * one) and inside > 0
    # nothing outside the captured layers is taken off: the stem and the head stay
    everything = layers_dispatch_s(traced, spec.achievable.host, ["stem", "head", *captured])
    assert everything > inside
    eager_host = 10e-3
    host = graph_layers_host_s(model, (x,), spec, captured, eager_host)
    replays = 4 * 50e-6 + 4 * 4 * 2e-6  # four blocks of two Linears: 4 parameter tensors each
    assert host == pytest.approx(eager_host - inside + replays)
    # a per-parameter rate of 0 is not kept in a profile: it counts as none
    assert rates_of(_spec(graph_layer=50e-6)) == (50e-6, 0.0)


def test_a_name_that_is_not_a_module_counts_no_parameters():
    model, x = Stack(), torch.empty(32, 64, device="meta")
    spec = _spec(graph_layer=50e-6, graph_layer_param=2e-6)
    host = graph_layers_host_s(model, (x,), spec, ["blocks.0", "nope"], 10e-3)
    traced = trace(model, (x,), train=True)
    inside = layers_dispatch_s(traced, spec.achievable.host, ["blocks.0"])
    assert host == pytest.approx(10e-3 - inside + 2 * 50e-6 + 4 * 2e-6)


def test_the_loop_prices_a_graph_layers_stage_with_the_replays_where_it_can():
    """fix_by_fix's stage pricing: the stage's eager audit with the host replaced, where the
    profile has the rates and the stage names the layers it captured; else None (graph mode)."""
    from types import SimpleNamespace

    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.graph_layers_host import stage_step as _graph_layers_step
    from gpushape.steps.step import build_step

    model = Stack()
    batch = synthetic_batch(model, (torch.randn(32, 64),))
    captured = [SimpleNamespace(transform="graph-layers", module=f"blocks.{i}") for i in range(4)]
    variant = SimpleNamespace(
        step=build_step(model, batch, "sgd"), optimize_report=SimpleNamespace(applied=captured)
    )
    spec = _spec(graph_layer=50e-6, graph_layer_param=2e-6)
    report, step = _graph_layers_step(variant, spec, None)
    assert report.step.mode == "eager" and step.gpu_s == report.step.gpu_s  # nothing copied
    names = [c.module for c in captured]
    expected = graph_layers_host_s(model, batch.inputs, spec, names, report.step.host_s)
    assert step.host_s == pytest.approx(expected) and step.host_s != report.step.host_s
    # the captured layers' kernels idle between each other as a graph's: the profile's gap
    from gpushape.auditing.modes import device_gap_s

    gap = device_gap_s(spec, "eager") - device_gap_s(spec, "graph")
    assert gap > 0 and 0 <= step.idle_s < report.step.idle_s
    assert (report.step.idle_s - step.idle_s) / gap == pytest.approx(
        round((report.step.idle_s - step.idle_s) / gap)
    )  # a whole number of kernels
    assert _graph_layers_step(variant, _spec(), None) is None  # no rates: graph mode
    nothing = SimpleNamespace(step=variant.step, optimize_report=SimpleNamespace(applied=[]))
    assert _graph_layers_step(nothing, spec, None) is None  # nothing captured


def test_the_replays_copies_into_the_graphs_cost_gpu_time():
    """A captured layer's copies (the bytes its capture recorded: an input that is not an
    earlier layer's output, an output gradient that is not a later layer's input gradient)
    are read and written at the copy rate, on top of the eager step's GPU work."""
    from types import SimpleNamespace

    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.graph_layers_host import copies_s, stage_step
    from gpushape.steps.step import build_step
    from gpushape.transforms._graph_replay import MARK, LayerState

    model = Stack()
    batch = synthetic_batch(model, (torch.randn(32, 64),))
    names = [f"blocks.{i}" for i in range(4)]
    spec = _spec(graph_layer=50e-6, graph_layer_param=2e-6)
    assert copies_s(model, spec, names) == 0.0  # nothing captured: nothing recorded
    for i, name in enumerate(names):
        state = LayerState(None, None)
        state.copied = 8192 if i in (0, 3) else 0  # a chain: its first input, its last gradient
        model.get_submodule(name).__dict__[MARK] = state
    rate = spec.attainable_bandwidth_bytes_per_s()
    assert copies_s(model, spec, [*names, "nope"]) == pytest.approx(2 * 2 * 8192 / rate)
    captured = [SimpleNamespace(transform="graph-layers", module=n) for n in names]
    variant = SimpleNamespace(
        step=build_step(model, batch, "sgd"), optimize_report=SimpleNamespace(applied=captured)
    )
    report, step = stage_step(variant, spec, None)
    assert step.gpu_s == pytest.approx(report.step.gpu_s + 4 * 8192 / rate)


def test_each_replay_adds_the_profiles_graph_boundary_gap():
    """Two replays a captured layer (forward and backward), each the profile's measured
    "graph_replay" gap of GPU idle time; a profile without it prices none."""
    from types import SimpleNamespace

    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.graph_layers_host import replays_idle_s, stage_step
    from gpushape.steps.step import build_step

    model = Stack()
    batch = synthetic_batch(model, (torch.randn(32, 64),))
    names = [f"blocks.{i}" for i in range(4)]
    spec = _spec(graph_layer=50e-6, graph_layer_param=2e-6)
    assert replays_idle_s(spec, names) == 0.0
    gaps = {**spec.achievable.device_gap, "graph_replay": 3e-6}
    gapped = spec.replace(achievable=dataclasses.replace(spec.achievable, device_gap=gaps))
    assert replays_idle_s(gapped, names) == pytest.approx(2 * 4 * 3e-6)
    captured = [SimpleNamespace(transform="graph-layers", module=n) for n in names]
    variant = SimpleNamespace(
        step=build_step(model, batch, "sgd"), optimize_report=SimpleNamespace(applied=captured)
    )
    (_, plain), (_, with_gap) = stage_step(variant, spec, None), stage_step(variant, gapped, None)
    assert with_gap.idle_s - plain.idle_s == pytest.approx(2 * 4 * 3e-6)
