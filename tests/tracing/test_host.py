"""The host model: counts from the trace, rates from the profile, the eager step's host side."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import gpushape
from gpushape.auditing import audit
from gpushape.hardware import get_gpu
from gpushape.hardware.profile import apply_profile
from gpushape.probe.host import measure_host
from gpushape.tracing.host import host_cost, module_calls

RATES = {"op": 10e-6, "view": 2e-6, "backward_op": 12e-6, "module": 1e-6}


def _mlp() -> tuple[nn.Module, tuple]:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    return model, (torch.empty(16, 64, device="meta"),)


def _gpu(rates=RATES):
    gpu = get_gpu("h200")
    return gpu.replace(achievable=dataclasses.replace(gpu.achievable, host=rates))


def test_counts_and_seconds_follow_the_trace():
    model, inputs = _mlp()
    trace = gpushape.trace(model, inputs, train=True)
    cost = host_cost(trace, _gpu())
    forward = [r for r in trace.ops if r.phase == "forward" and r.kind == "compute"]
    assert cost.forward_ops == len(forward) > 0
    assert cost.backward_ops > 0
    assert cost.module_calls == module_calls(trace) == 4  # the Sequential and its 3 children
    expected = (
        cost.forward_ops * 10e-6
        + cost.views * 2e-6
        + cost.backward_ops * 12e-6
        + cost.module_calls * 1e-6
    )
    assert abs(cost.seconds - expected) < 1e-12


def test_no_rates_no_host_model():
    model, inputs = _mlp()
    trace = gpushape.trace(model, inputs, train=True)
    assert host_cost(trace, _gpu({})) is None
    assert host_cost(trace, _gpu({"op": 1e-5})) is None  # all four or nothing


def test_the_eager_step_is_host_bound_when_dispatch_outlasts_the_gpu():
    model, inputs = _mlp()  # microseconds of GPU work: any real host rate dominates
    slow = _gpu({k: v * 100 for k, v in RATES.items()})
    eager = audit(model, inputs, slow, train=True, mode="eager", profile=None).step
    graph = audit(model, inputs, slow, train=True, mode="graph", profile=None).step
    plain = audit(model, inputs, _gpu({}), train=True, mode="eager", profile=None).step
    assert eager.bound == "host" and eager.host_s > plain.host_s
    assert graph.host_s < eager.host_s  # a graph's replay has no dispatch


def test_the_probe_measures_every_rate_and_the_profile_reads_them():
    rows = measure_host("cpu", calls=50, repeats=2)
    assert set(rows) == {*RATES, "accumulate_grad"}
    assert all(r["seconds"] >= 0 and r["workload"] for r in rows.values())
    assert rows["op"]["seconds"] > 0 and rows["backward_op"]["seconds"] > 0
    spec = apply_profile(get_gpu("h200"), {"host": rows})
    assert spec.achievable.host["op"] == rows["op"]["seconds"]
    assert "host" in spec.achievable.measured


def test_the_probe_measures_a_foreach_optimizers_host_beyond_the_fused_one():
    from gpushape.tracing.host import FOREACH_HOST
    from gpushape.tracing.optimizer_step import foreach_host_s

    rows = measure_host("cpu", calls=50, repeats=3, classes=("op", "optimizer"))
    for name in ("AdamW", "SGD"):
        row = rows[f"{FOREACH_HOST}/{name}"]
        assert row["seconds"] >= 0 and row["calls"] == 64 and name in row["workload"]
    spec = apply_profile(get_gpu("h200"), {"host": rows})
    rate = spec.achievable.host[f"{FOREACH_HOST}/AdamW"]
    import torch

    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    assert foreach_host_s(torch.optim.AdamW(params, foreach=True), spec.achievable.host) == (
        3 * rate
    )


def test_op_classes_take_their_own_rates_and_fall_back_to_op():
    from gpushape.tracing.host import op_class

    assert op_class("aten.convolution.default") == "conv"
    assert op_class("aten.convolution_backward.default") == "conv"
    assert op_class("aten.addmm.default") == "gemm"
    assert op_class("aten.native_layer_norm_backward.default") == "layer_norm"
    assert op_class("aten._scaled_dot_product_flash_attention.default") == "attention"
    assert op_class("aten.add.Tensor") == "op"
    model, inputs = _mlp()
    trace = gpushape.trace(model, inputs, train=True)
    base = host_cost(trace, _gpu()).seconds
    gemms = {**RATES, "gemm": 1e-3, "gemm/backward": 2e-3}
    forward = sum(r.phase == "forward" and op_class(r.op) == "gemm" for r in trace.ops)
    backward = sum(r.phase == "backward" and op_class(r.op) == "gemm" for r in trace.ops)
    assert forward == 2 and backward > 0
    grown = host_cost(trace, _gpu(gemms)).seconds
    expected = base + forward * (1e-3 - 10e-6) + backward * (2e-3 - 12e-6)
    assert abs(grown - expected) < 1e-9


def test_fused_row_norms_are_their_own_class_priced_as_before_until_measured():
    from gpushape.tracing.host import op_class, rate

    assert op_class("gpushape.add_layer_norm.default") == "gpushape_norm"
    assert op_class("gpushape.add_layer_norm_backward.default") == "gpushape_norm"
    assert op_class("gpushape.rms_norm.default") == "gpushape_norm"
    assert op_class("gpushape.batch_norm_act.default") == "gpushape"
    old = {**RATES, "gpushape": 60e-6, "gpushape/backward": 300e-6}
    assert rate(old, "gpushape_norm", False) == 60e-6  # a profile from before: BatchNormAct's
    assert rate(old, "gpushape_norm", True) == 300e-6
    new = {**old, "gpushape_norm": 50e-6, "gpushape_norm/backward": 200e-6}
    assert rate(new, "gpushape_norm", True) == 200e-6
    assert rate(RATES, "gpushape_norm", False) == RATES["op"]  # neither measured


def test_group_norm_is_its_own_class_priced_as_gpushape_until_measured():
    from gpushape.tracing.host import op_class, rate

    assert op_class("gpushape.group_norm_act.default") == "gpushape_group_norm"
    assert op_class("gpushape.group_norm_act_backward.default") == "gpushape_group_norm"
    old = {**RATES, "gpushape": 60e-6, "gpushape/backward": 300e-6}
    assert rate(old, "gpushape_group_norm", True) == 300e-6
    new = {**old, "gpushape_group_norm": 40e-6, "gpushape_group_norm/backward": 90e-6}
    assert (rate(new, "gpushape_group_norm", False), rate(new, "gpushape_group_norm", True)) == (
        40e-6,
        90e-6,
    )


def test_the_trace_counts_gradient_leaves_and_each_costs_the_accumulate_rate():
    model, inputs = _mlp()  # two Linears: two weights, two biases
    trace = gpushape.trace(model, inputs, train=True)
    assert trace.grad_leaves == 4 and trace.to_dict()["grad_leaves"] == 4
    assert gpushape.trace(model, inputs, train=False).grad_leaves == 0
    model[0].weight.requires_grad_(False)  # frozen: no gradient, no node
    assert gpushape.trace(model, inputs, train=True).grad_leaves == 3
    model[0].weight.requires_grad_(True)
    base = host_cost(trace, _gpu())
    grown = host_cost(trace, _gpu({**RATES, "accumulate_grad": 1e-3}))
    assert grown.grad_leaves == 4
    assert abs(grown.seconds - base.seconds - 4 * 1e-3) < 1e-12


def test_module_glue_replaces_the_bare_call_rate_where_fitted():
    from gpushape.tracing.host import forward_seconds

    model, inputs = _mlp()
    trace = gpushape.trace(model, inputs, train=True)
    base = host_cost(trace, _gpu())
    glued = host_cost(trace, _gpu({**RATES, "module_glue": 5e-4}))
    assert abs(glued.seconds - base.seconds - 4 * (5e-4 - RATES["module"])) < 1e-12
    bare = forward_seconds(trace, RATES, glue=False)
    assert abs(forward_seconds(trace, RATES) - bare - 4 * RATES["module"]) < 1e-12
    forward = [r for r in trace.ops if r.phase == "forward"]
    ops = sum(r.kind == "compute" for r in forward) * RATES["op"]
    views = sum(r.kind == "view" for r in forward) * RATES["view"]
    assert abs(bare - ops - views) < 1e-12


def test_launch_bound_counts_the_host_models_dispatch_not_only_the_launches():
    model, inputs = _mlp()
    slow = _gpu({k: v * 100 for k, v in RATES.items()})  # the host's dispatch dwarfs the launches
    report = audit(model, inputs, slow, train=True, mode="eager", profile=None)
    f = next(f for f in report.findings if f.rule == "launch-bound")
    ev = f.evidence
    assert ev["eager_host_time_s"] == pytest.approx(report.step.host_s)
    assert ev["eager_host_time_s"] > ev["eager_launch_time_s"]
    assert f.est_saving_s == pytest.approx(
        max(ev["gpu_time_s"], ev["eager_host_time_s"])
        - max(ev["gpu_time_s"], ev["graph_launch_time_s"])
    )
    assert "the host takes" in f.message
    plain = audit(model, inputs, _gpu({}), train=True, mode="eager", profile=None)
    g = next(f for f in plain.findings if f.rule == "launch-bound")  # launches alone, as before
    assert g.evidence["eager_host_time_s"] == g.evidence["eager_launch_time_s"]
    assert "to launch eagerly" in g.message


def test_grouped_convolutions_are_their_own_class_priced_as_convolutions_until_measured():
    from gpushape.tracing.host import rate, record_class

    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 1))
    trace = gpushape.trace(model, (torch.empty(2, 8, 4, 4, device="meta"),), train=True)
    convs = [r for r in trace.ops if "convolution" in r.op]
    classes = sorted((r.phase, record_class(r)) for r in convs)
    assert classes == [
        ("backward", "conv"),
        ("backward", "grouped_conv"),
        ("forward", "conv"),
        ("forward", "grouped_conv"),
    ]
    rates = {**RATES, "conv": 2e-5, "conv/backward": 6e-5}
    assert rate(rates, "grouped_conv", False) == 2e-5  # unmeasured: the convolutions' rate
    grouped = {**rates, "grouped_conv": 3e-5, "grouped_conv/backward": 9e-5}
    grown = host_cost(trace, _gpu(grouped)).seconds - host_cost(trace, _gpu(rates)).seconds
    assert grown == pytest.approx(1e-5 + 3e-5)


@pytest.mark.gpu
def test_the_probe_prices_a_layer_replayed_from_cuda_graphs():
    """graph-layers' replay rates (probe/host.py `_graph_layer_rates`): a layer's fixed host
    cost is positive, a parameter's at least 0, and a profile reads both."""
    from gpushape.probe.host import _graph_layer_rates

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run `pytest -m gpu` on the GPU machine)")
    rows = _graph_layer_rates(torch.device("cuda"), torch.bfloat16, 3)
    assert rows["graph_layer"]["seconds"] > 0 and rows["graph_layer_param"]["seconds"] >= 0
    spec = apply_profile(get_gpu("h100"), {"host": rows})
    assert spec.achievable.host["graph_layer"] == rows["graph_layer"]["seconds"]
