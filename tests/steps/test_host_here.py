"""The loop's second prediction, on this host's rates (steps/host_here.py): the host's issue
time of the step as given over the audit's scales every host rate of the profile."""

from __future__ import annotations

import pytest
import torch

import gpushape
from gpushape.auditing.target import resolve_target
from gpushape.steps import loop
from gpushape.steps.host_here import host_scale, scaled_target
from gpushape.steps.measure import StepStats
from transforms.nets import ConvNet

FAST = dict(rounds=2, block=1, warmup=1)


def _given(issue_s: float | None, busy_s: float | None = None, step_s: float = 1.0) -> StepStats:
    return StepStats(variant="as given", step_times_s=(step_s,), warmup_s=0.0, samples=2,
                     tokens=0, issue_s=issue_s, gpu_busy_s=busy_s)  # fmt: skip


def test_the_scale_is_the_measured_issue_over_the_audits_host():
    assert host_scale(_given(0.03), 0.02) == pytest.approx(1.5)
    assert host_scale(_given(None), 0.02) is None  # no CUDA: the CPU ran the step itself
    assert host_scale(_given(0.03), 0.0) is None and host_scale(None, 0.02) is None
    assert host_scale(_given(0.3), 0.02) is None  # 15x: a host that waited on something else
    # issued in about its GPU time: the host may have waited on the GPU, so the issue time
    # bounds the host's from above and only lowers the profile's rates
    assert host_scale(_given(0.04, busy_s=0.041, step_s=0.042), 0.02) == 1.0
    assert host_scale(_given(0.015, busy_s=0.016, step_s=0.0165), 0.02) == pytest.approx(0.75)
    # ... unless the step ran well past its GPU time: the GPU idled, the queue never filled,
    # and the issue time is the host's own (PoolFormerV2-S12 eager on an H100)
    pfv2 = _given(0.0268, busy_s=0.0236, step_s=0.0268)
    assert host_scale(pfv2, 0.021) == pytest.approx(0.0268 / 0.021)
    assert host_scale(_given(0.03, busy_s=0.06), 0.02) == pytest.approx(1.5)  # its own time
    # the host issues every step in turn: its steady cost is at most the step's median
    assert host_scale(_given(0.03, step_s=0.025), 0.02) == pytest.approx(1.25)


def test_a_scaled_target_scales_every_host_rate_and_nothing_else():
    given = resolve_target("h200").spec
    scaled = scaled_target("h200", 2.0).spec
    assert given.achievable.host  # the shipped profile's measured rates
    for name, rate in given.achievable.host.items():
        assert scaled.achievable.host[name] == pytest.approx(2 * rate)
    assert scaled.achievable.launch_overhead_s == given.achievable.launch_overhead_s
    assert scaled.achievable.memory("elementwise") == given.achievable.memory("elementwise")
    x = torch.empty(8, 3, 32, 32, device="meta", dtype=torch.bfloat16)
    model = ConvNet().to(device="meta", dtype=torch.bfloat16)
    slow = gpushape.audit(model, (x,), scaled_target("h200", 2.0), train=True)
    fast = gpushape.audit(model, (x,), "h200", train=True)
    assert slow.step.gpu_s == pytest.approx(fast.step.gpu_s)
    assert slow.step.host_s == pytest.approx(2 * fast.step.host_s, rel=0.05)


def test_the_loop_predicts_again_on_this_hosts_rates(monkeypatch):
    from gpushape.steps import run

    # the CPU has no issue time of its own: say this host issued the step as given in 5 ms
    monkeypatch.setattr(run, "issue_time", lambda step, cuda=None: 0.005)
    result = loop(ConvNet(), (torch.zeros(2, 3, 16, 16),), gpu="h200", **FAST)
    assert result.host_scale is not None
    issued = min(0.005, result.stages["as given"].median_s)  # at most a step's median
    assert result.host_scale == pytest.approx(issued / result.audit.step.host_s)
    assert all(r.predicted_here_wall_s is not None for r in result.rows)
    doc = result.to_dict()
    assert doc["host_scale"] == result.host_scale
    assert "ratio_here" in doc["fixes"][0]


@pytest.mark.gpu
def test_a_compiled_loop_on_a_gpu_predicts_on_its_own_host():
    """On a GPU the step as given's issue time is measured, so every fix gets its second
    prediction; and each stage compiles (none hits Dynamo's recompile limit and runs eager:
    a stage's kernels stay near the step as given's, not the eager step's)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.LayerNorm(256))
          for _ in range(4)]
    ).cuda().to(torch.bfloat16)  # fmt: skip
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    result = loop(model, (x,), mode="compile", gpu="h200", rounds=2, block=2, warmup=2)
    assert result.host_scale is not None
    assert all(r.predicted_here_wall_s is not None for r in result.rows)
    given = result.stages["as given"].kernels
    assert all(s.kernels <= 2 * given for s in result.stages.values() if s.kernels)
