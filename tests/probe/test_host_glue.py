"""probe/host_glue.py: module_glue fitted from real forwards against their traced ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.probe import host_glue
from gpushape.probe.host_glue import GlueSample, fit, issue_seconds, measure_glue, plain_loss
from gpushape.steps import synthetic_batch

RATES = {"op": 10e-6, "view": 2e-6, "backward_op": 12e-6, "module": 1e-6}


def test_the_fit_pools_the_models_excess_over_their_module_calls():
    samples = [GlueSample("a", 0.010, 0.006, 100), GlueSample("b", 0.030, 0.010, 400)]
    out = fit(samples)
    assert out["seconds"] == pytest.approx((0.004 + 0.020) / 500)
    assert out["per_model"] == pytest.approx({"a": 40e-6, "b": 50e-6})
    assert out["calls"] == 500 and "a, b" in out["workload"]
    # a forward faster than its predicted ops adds no negative glue
    assert fit([GlueSample("c", 0.001, 0.002, 10)])["seconds"] == 0.0
    assert fit([]) is None


def test_issue_seconds_times_forward_and_backward_of_a_real_step():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    fwd, bwd = issue_seconds(model, (torch.randn(4, 8),), repeats=3)
    assert fwd > 0 and bwd > 0
    assert all(p.grad is not None for p in model.parameters())  # the backward ran
    batch = synthetic_batch(model, (torch.randn(4, 8),))  # a task's loss, as the benchmark's
    assert min(issue_seconds(model, batch.inputs, 2, loss=batch.loss)) > 0


def test_the_plain_loss_takes_the_first_floating_output_that_needs_a_gradient():
    x = torch.randn(3, requires_grad=True)
    ids = torch.arange(3)
    assert plain_loss((ids, x * 2)).item() == pytest.approx((x * 2).float().mean().item())
    with pytest.raises(ValueError, match="no floating tensor"):
        plain_loss((ids, x.detach()))


def test_a_sample_prices_its_model_trace_without_glue():
    sample = host_glue.predicted_sample("resnet50", 0.05, RATES, batch=2)
    assert sample.modules > 20 and 0 < sample.ops_s < 0.05
    assert sample.per_module_s == pytest.approx((0.05 - sample.ops_s) / sample.modules)


def test_no_glue_off_cuda_and_the_zoo_stands_in_for_missing_libraries(monkeypatch):
    assert measure_glue("cpu", RATES) is None
    import gpushape.models.library as library

    monkeypatch.setattr(library, "library_missing", lambda spec: "not installed")
    assert host_glue._available(host_glue.MODELS) == list(host_glue.ZOO_MODELS)
    monkeypatch.setattr(library, "library_missing", lambda spec: None)
    assert host_glue._available(host_glue.QUICK_MODELS) == list(host_glue.QUICK_MODELS)


@pytest.mark.gpu
def test_issue_seconds_with_the_gpu_held():
    """With the GPU held, a pass's issue time is the host's own; a loss that syncs waits for
    the hold to end, and its median says so (NaN)."""
    import math

    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).cuda()
    x = (torch.randn(16, 64, device="cuda"),)
    fwd, bwd = issue_seconds(model, x, 3, hold_s=0.05)
    assert 0 < fwd < 0.045 and 0 < bwd < 0.045

    def syncing(out):
        value = out.float().pow(2).mean()
        value.item()  # waits for the GPU, held
        return value

    fwd, _ = issue_seconds(model, x, 2, loss=syncing, hold_s=0.05)
    assert math.isnan(fwd)
