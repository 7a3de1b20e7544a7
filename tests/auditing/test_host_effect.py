"""auditing/host_effect.py: what a fix does to the host's dispatch, and so to an eager step."""

from __future__ import annotations

import dataclasses

import pytest

import gpushape
from gpushape.auditing.finding import Severity
from gpushape.auditing.host_effect import INSTEAD, NORM_ACT, host_saving_s
from gpushape.hardware import get_gpu
from gpushape.hardware.profile import calibrated
from gpushape.models import create_model
from gpushape.tracing.host import op_class, rate


def _finding(report, rule):
    return next(f for f in report.findings if f.rule == rule)


@pytest.fixture(scope="module")
def bert_manual():
    model, inputs = create_model("bert-base", attention="manual", batch=8)
    return model, inputs


def test_sdpa_dispatches_one_op_where_manual_attention_dispatched_several(bert_manual):
    model, inputs = bert_manual
    gpu = calibrated("h200")
    report = gpushape.audit(model, inputs, gpu=gpu, train=True, mode="eager")
    f = _finding(report, "manual-attention")
    assert report.step.bound == "host"
    # the host's share: positive, so the host-bound step gains more than nothing
    assert f.evidence["wall_saving_s"] > 0
    assert f.severity > Severity.INFO


def test_the_saving_is_the_replaced_ops_less_what_runs_instead():
    gpu = calibrated("h200")
    rates = gpu.achievable.host
    model, inputs = create_model("resnet50", batch=2)
    report = gpushape.audit(model, inputs, gpu=gpu, train=True, mode="eager")
    fused = [f for f in report.findings if f.rule == "unfused-norm-act"]
    assert fused
    trace = gpushape.trace(model, inputs, train=True)
    ctx = _Ctx(trace, gpu)
    for f in fused:
        ops = [trace.ops[i] for i in sorted(f.replaces)]
        before = sum(
            rates["view"]
            if r.kind == "view"
            else rate(rates, op_class(r.op), r.phase == "backward")
            for r in ops
            if r.kind in ("view", "compute")
        )
        cls, fwd, bwd = NORM_ACT["batch_norm"]
        after = f.evidence["sites"] * (fwd * rate(rates, cls, False) + bwd * rate(rates, cls, True))
        assert host_saving_s(f, ctx) == pytest.approx(before - after)
        assert host_saving_s(f, ctx) < 0  # gpushape's BatchNormAct2d: more host per call
        assert host_saving_s(f, _Ctx(trace, gpu, train=False)) > host_saving_s(f, ctx)


def test_fixes_that_dispatch_the_same_ops_or_profiles_without_host_rates_save_nothing():
    gpu = calibrated("h200")
    model, inputs = create_model("resnet50", batch=64)
    report = gpushape.audit(model, inputs, gpu=gpu, train=True, mode="eager")
    trace = gpushape.trace(model, inputs, train=True)
    layout = _finding(report, "nchw-conv")
    assert layout.fix not in INSTEAD and host_saving_s(layout, _Ctx(trace, gpu)) == 0.0
    fused = _finding(report, "unfused-norm-act")
    bare = get_gpu("h200")  # datasheet numbers: no host rates
    assert not bare.achievable.host
    assert host_saving_s(fused, _Ctx(trace, bare)) == 0.0


def test_the_optimizer_step_is_outside_the_traced_step_so_its_saving_is_wall_time():
    from gpushape.auditing.modes import StepTime, wall_saving_s

    gpu = calibrated("h200")
    model, inputs = create_model("resnet50", batch=2)
    trace = gpushape.trace(model, inputs, train=True)
    step = StepTime(mode="eager", gpu_s=0.001, host_s=0.02)  # host-bound
    f = dataclasses.replace(
        _finding(gpushape.audit(model, inputs, gpu=gpu, train=True), "unfused-norm-act"),
        fix="fused-optimizer",
        est_saving_s=0.003,
    )
    assert wall_saving_s(f, step, _Ctx(trace, gpu)) == pytest.approx(0.003)


def test_a_foreach_optimizer_costs_the_eager_host_its_python_and_fusing_it_saves_that():
    import torch

    from gpushape.auditing.modes import StepTime, wall_saving_s
    from gpushape.tracing.host import FOREACH_HOST
    from gpushape.tracing.optimizer_step import foreach_host_s

    gpu = calibrated("h200")
    rates = gpu.achievable.host
    per_tensor = rates[f"{FOREACH_HOST}/AdamW"]
    assert 1e-6 < per_tensor < 1e-4  # fitted from the H200 loops: tens of microseconds
    params = [torch.nn.Parameter(torch.zeros(4, 4)) for _ in range(10)]
    foreach = torch.optim.AdamW(params, foreach=True)
    assert foreach_host_s(foreach, rates) == pytest.approx(10 * per_tensor)
    assert foreach_host_s(torch.optim.AdamW(params, fused=True), rates) == 0.0
    assert foreach_host_s(torch.optim.AdamW(params, foreach=False), rates) == 0.0
    assert foreach_host_s(foreach, {}) == 0.0  # a profile without host rates
    assert foreach_host_s(object(), rates) == 0.0
    # a rate for the class, else the optimizer-wide one
    assert foreach_host_s(torch.optim.RMSprop(params, foreach=True), rates) == 0.0
    assert foreach_host_s(
        torch.optim.RMSprop(params, foreach=True), {FOREACH_HOST: 2e-6}
    ) == pytest.approx(2e-5)

    model, inputs = create_model("resnet50", batch=2)
    trace = gpushape.trace(model, inputs, train=True)
    f = dataclasses.replace(
        _finding(gpushape.audit(model, inputs, gpu=gpu, train=True), "unfused-norm-act"),
        fix="fused-optimizer",
        est_saving_s=0.0005,
        evidence={"time_step_s": 0.001},
    )
    ctx = _Ctx(trace, gpu, optimizer=foreach)
    host = 10 * per_tensor
    # host-bound by far: the wall saves the host's share, more than the GPU's
    step = StepTime(mode="eager", gpu_s=0.001, host_s=0.02)
    assert wall_saving_s(f, step, ctx) == pytest.approx(host)
    # GPU-bound by far: the GPU's saving
    step = StepTime(mode="eager", gpu_s=0.05, host_s=0.02)
    assert wall_saving_s(f, step, ctx) == pytest.approx(0.0005, rel=1e-3)
    # compile mode: torch.compile leaves optimizer.step eager, so its Python is saved there too
    step = StepTime(mode="compile", gpu_s=0.001, host_s=0.02)
    assert wall_saving_s(f, step, ctx) == pytest.approx(host)
    # graph mode: the step (the optimizer's too) replays from a graph, no Python to save
    step = StepTime(mode="graph", gpu_s=0.001, host_s=0.02)
    assert wall_saving_s(f, step, ctx) == pytest.approx(0.0005)


def test_s2d_stem_keeps_the_convolution_and_adds_its_folds():
    from gpushape.auditing.host_effect import EXTRA

    from .cases import CASES

    model, inputs, kwargs = CASES["slow-stem"].fires.build()
    gpu = kwargs["gpu"]
    rates = gpu.achievable.host
    report = gpushape.audit(model, inputs, gpu=gpu, train=True, mode="eager")
    f = _finding(report, "slow-stem")
    ctx = _Ctx(gpushape.trace(model, inputs, train=True), gpu)
    cls, fwd, bwd = EXTRA["s2d-stem"]
    added = fwd * rate(rates, cls, False) + bwd * rate(rates, cls, True)
    assert host_saving_s(f, ctx) == pytest.approx(-added) and added > 0


@dataclasses.dataclass
class _Ctx:  # what host_saving_s and wall_saving_s read of an AuditContext
    trace: object
    gpu: object
    train: bool = True
    optimizer: object = None


def test_the_eager_step_host_includes_a_foreach_optimizer_and_fusing_it_is_priced_on_it():
    import torch

    from gpushape.tracing.optimizer_step import foreach_host_s

    gpu = calibrated("h200")
    model, inputs = create_model("bert-base", batch=1)
    foreach = torch.optim.AdamW(model.parameters(), foreach=True)
    fused = torch.optim.AdamW(model.parameters(), fused=True)
    with_foreach = gpushape.audit(model, inputs, gpu=gpu, train=True, optimizer=foreach)
    with_fused = gpushape.audit(model, inputs, gpu=gpu, train=True, optimizer=fused)
    extra = foreach_host_s(foreach, gpu.achievable.host)
    assert extra > 0
    assert with_foreach.step.host_s == pytest.approx(with_fused.step.host_s + extra)
    f = _finding(with_foreach, "optimizer-not-fused")
    assert with_foreach.step.bound == "host"  # batch 1: the host sets the pace
    assert f.evidence["wall_saving_s"] > f.est_saving_s  # its Python, not only its kernels


def test_the_steps_gpu_side_counts_the_optimizers_step_and_fusing_it_saves_from_there():
    import torch

    gpu = calibrated("h200")
    model, inputs = create_model("bert-base", batch=8)
    bare = gpushape.audit(model, inputs, gpu=gpu, train=True)
    foreach = torch.optim.AdamW(model.parameters(), foreach=True)
    report = gpushape.audit(model, inputs, gpu=gpu, train=True, optimizer=foreach)
    f = _finding(report, "optimizer-not-fused")
    # the foreach step's kernels as the profile prices them (its bytes at the fitted rate of
    # foreach AdamW's kernels, a time per tensor per kernel), on the GPU's queue after the
    # backward
    assert f.evidence["bytes_moved"] > 0
    extra = report.step.gpu_s - bare.step.gpu_s
    bandwidth = gpu.attainable_bandwidth_bytes_per_s()
    rates = gpu.achievable.optimizer_kernels
    kernels_s = (
        f.evidence["bytes_moved"] / (bandwidth * rates["foreach/AdamW"])
        + rates["foreach/tensor"] * f.evidence["parameters"] * f.evidence["kernels"]
    )
    assert extra == pytest.approx(kernels_s, rel=0.05)
    assert extra > f.evidence["bytes_moved"] / bandwidth  # slower than their bytes alone
    # GPU-bound: the fix saves its GPU time, counted once
    if report.step.bound == "gpu":
        assert f.evidence["wall_saving_s"] == pytest.approx(f.est_saving_s, rel=0.05)
    assert f.evidence["wall_saving_s"] <= f.est_saving_s + report.step.host_s


def test_an_optimizer_steps_kernels_cost_a_time_per_tensor_beside_their_bytes():
    import torch

    from gpushape.tracing.optimizer_step import StepCost, step_gpu_s

    gpu = get_gpu("h200")
    bandwidth = gpu.attainable_bandwidth_bytes_per_s()
    step = StepCost("foreach", kernels=3, bytes_moved=10**8, parameters=200)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
    assert step_gpu_s(step, sgd, gpu) == pytest.approx(1e8 / bandwidth)  # unfitted: the bytes
    rates = {"foreach": 0.5, "foreach/tensor": 1e-7, "foreach/SGD": 0.8}
    fitted = gpu.replace(achievable=dataclasses.replace(gpu.achievable, optimizer_kernels=rates))
    assert step_gpu_s(step, sgd, fitted) == pytest.approx(1e8 / (bandwidth * 0.8) + 1e-7 * 600)
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])  # no class row: generic
    assert step_gpu_s(step, adamw, fitted) == pytest.approx(1e8 / (bandwidth * 0.5) + 6e-5)
    loop = StepCost("for-loop", kernels=600, bytes_moved=10**8, parameters=200)
    assert step_gpu_s(loop, sgd, fitted) == pytest.approx(1e8 / bandwidth)


def test_a_fused_optimizers_step_is_priced_as_its_single_pass():
    import torch

    from gpushape.tracing.optimizer_step import current_step, fused_step

    params = [torch.nn.Parameter(torch.zeros(64, 64)) for _ in range(5)]
    fused = current_step(torch.optim.AdamW(params, fused=True))
    assert fused == fused_step(torch.optim.AdamW(params))
    assert fused.kernels == 1  # not the meta copy's per-parameter ops
    foreach = current_step(torch.optim.AdamW(params, foreach=True))
    assert foreach.bytes_moved > fused.bytes_moved and foreach.kernels > 1


def test_a_capturable_optimizer_is_priced_as_the_same_optimizer():
    """make_capturable rebuilds a CUDA-graphed step's optimizer with capturable=True, which
    refuses meta tensors: its step was left unpriced, as if it cost nothing."""
    import torch

    from gpushape.tracing.optimizer_step import current_step

    params = [torch.nn.Parameter(torch.zeros(64, 64)) for _ in range(5)]
    for kind in ({"fused": True}, {"foreach": True}):
        plain = current_step(torch.optim.AdamW(params, **kind))
        captured = torch.optim.AdamW(params, **kind)
        for group in captured.param_groups:
            group["capturable"] = True  # as make_capturable leaves it (CPU refuses it at init)
        assert current_step(captured) == plain


def test_an_optimizer_whose_step_cannot_run_on_meta_is_said_to_be_unpriced():
    import torch

    class NeedsValues(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("reads a loss value")

    model = torch.nn.Linear(16, 16, device="meta")
    inputs = (torch.empty(64, 16, device="meta"),)
    with pytest.warns(UserWarning, match="NeedsValues's step could not be priced"):
        report = gpushape.audit(
            model, inputs, gpu="h200", train=True, optimizer=NeedsValues(model.parameters())
        )
    bare = gpushape.audit(model, inputs, gpu="h200", train=True)
    assert report.step.gpu_s == bare.step.gpu_s  # counted as no step, and said so
