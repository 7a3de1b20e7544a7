"""fast-max-pool: nn.MaxPool2d becomes gpushape's MaxPool2d: the same outputs and gradients,
refused where the kernel cannot take the settings, reversible, and the audit's finding gone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape import audit
from gpushape.hardware import calibrated, get_gpu
from gpushape.kernels import MaxPool2d
from gpushape.tracing.families import memory_family
from gpushape.tracing.tracer import trace
from gpushape.transforms import optimize, revert


class Stem(nn.Module):
    def __init__(self, pool: nn.Module):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU()
        self.pool = pool
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.pool(self.act(self.conv(x))))


def _grads(model, x):
    x = x.detach().clone().requires_grad_()
    model.zero_grad()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("channels_last", [False, True])
def test_swapped_equal_outputs_and_gradients_and_reverted(channels_last):
    torch.manual_seed(0)
    model = Stem(nn.MaxPool2d(3, 2, 1))
    x = torch.randn(2, 3, 17, 15)
    if channels_last:
        model, x = (
            model.to(memory_format=torch.channels_last),
            x.to(memory_format=torch.channels_last),
        )
    want = _grads(model, x)
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32,
                             transforms=["fast-max-pool"])  # fmt: skip
    assert [c.module for c in report.applied] == ["pool"]
    assert report.verified["fast-max-pool"].passed
    assert type(model.pool) is MaxPool2d
    got = _grads(model, x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert model.state_dict().keys() == Stem(nn.MaxPool2d(3, 2, 1)).state_dict().keys()
    _, again = optimize(model, (x,), gpu="h200", dtype=torch.float32,
                        transforms=["fast-max-pool"])  # fmt: skip
    assert not again.applied  # twice equals once
    model = revert(model)
    assert type(model.pool) is nn.MaxPool2d


@pytest.mark.parametrize(
    ("pool", "why"),
    [
        (nn.MaxPool2d(3, 2, 1, ceil_mode=True), "ceil_mode"),
        (nn.MaxPool2d(3, 2, 1, dilation=2), "dilation"),
        (nn.MaxPool2d(2, return_indices=False), None),
    ],
)
def test_settings_the_kernel_cannot_take_are_refused(pool, why):
    model = Stem(pool)
    _, report = optimize(model, (torch.randn(1, 3, 12, 12),), gpu="h200", dtype=torch.float32,
                         transforms=["fast-max-pool"])  # fmt: skip
    if why is None:
        assert [c.module for c in report.applied] == ["pool"]
        return
    assert not report.applied and type(model.pool) is nn.MaxPool2d
    assert why in report.refused[0].reason


def test_a_hooked_pool_and_a_subclass_are_left_alone():
    class MyPool(nn.MaxPool2d):
        pass

    model = Stem(MyPool(2))
    _, report = optimize(model, (torch.randn(1, 3, 8, 8),), gpu="h200", dtype=torch.float32,
                         transforms=["fast-max-pool"])  # fmt: skip
    assert not report.applied and not report.refused
    hooked = Stem(nn.MaxPool2d(2))
    hooked.pool.register_forward_hook(lambda m, i, o: None)
    _, report = optimize(hooked, (torch.randn(1, 3, 8, 8),), gpu="h200", dtype=torch.float32,
                         transforms=["fast-max-pool"])  # fmt: skip
    assert not report.applied and "hooks" in report.refused[0].reason


def test_the_rule_prices_resnets_stem_eager_and_compiled_and_is_quiet_after_the_fix():
    tv = pytest.importorskip("torchvision")
    with torch.device("meta"):
        model = tv.models.resnet50().to(torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.empty(256, 3, 224, 224, dtype=torch.bfloat16, device="meta").to(
        memory_format=torch.channels_last
    )
    eager = audit(model, (x,), "h200", train=True)
    found = next(f for f in eager.findings if f.rule == "slow-max-pool")
    assert found.fix == "fast-max-pool" and found.module == "maxpool"
    ev = found.evidence
    assert ev["time_kernel_s"] < ev["time_pytorch_s"]
    # the H200 profile measured torch's pool at about 15% of the copy rate: ~2.9 ms at 256
    assert 1e-3 < ev["time_pytorch_s"] < 5e-3
    assert found.est_saving_s == pytest.approx(ev["time_pytorch_s"] - ev["time_kernel_s"])
    # the H200 at that shape: eager 2.78 ms, Inductor's 1.81, gpushape's 0.73 (bench_max_pool)
    assert 1.5e-3 < found.est_saving_s < 2.5e-3
    compiled = audit(model, (x,), "h200", train=True, mode="compile")
    inductor = next(f for f in compiled.findings if f.rule == "slow-max-pool")
    ev = inductor.evidence
    assert inductor.est_saving_s == pytest.approx(ev["time_inductor_s"] - ev["time_kernel_s"])
    assert 0.7e-3 < inductor.est_saving_s < 1.4e-3
    model.maxpool = MaxPool2d(3, 2, 1)
    after = audit(model, (x,), "h200", train=True)
    assert not any(f.rule == "slow-max-pool" for f in after.findings)
    traced = trace(model, (x,), train=True)
    pools = [r for r in traced.ops if "max_pool" in r.name]
    assert [memory_family(r) for r in pools] == ["fused_max_pool"] * 2  # forward, backward


def test_without_a_rate_for_inductors_pool_the_rule_is_quiet_compiled():
    import dataclasses

    spec = calibrated(get_gpu("h200"))
    rates = {k: v for k, v in spec.achievable.memory_efficiency.items() if k != "pool_compiled"}
    spec = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency=rates))
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1)).to(torch.bfloat16)
    x = torch.empty(64, 3, 224, 224, dtype=torch.bfloat16, device="meta")
    compiled = audit(model, (x,), spec, train=True, mode="compile", profile=None)
    quiet = next(f for f in compiled.findings if f.rule == "slow-max-pool")
    assert quiet.est_saving_s == 0.0 and "no rate measured" in quiet.message


def test_an_nchw_pool_is_priced_at_the_kernels_nchw_rate():
    """The H200 at ResNet-50's stem in NCHW: PyTorch 3.16 ms, gpushape's 1.98 (bench_max_pool):
    the kernel walks planes there, at about a third of its channels_last rate."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1)).to(torch.bfloat16)
    x = torch.empty(256, 3, 224, 224, dtype=torch.bfloat16, device="meta")
    found = next(f for f in audit(model, (x,), "h200", train=True).findings
                 if f.rule == "slow-max-pool")  # fmt: skip
    assert found.evidence["nchw_pools"] == 1
    assert 1.5e-3 < found.evidence["time_kernel_s"] < 2.5e-3
    assert 0.8e-3 < found.est_saving_s < 1.6e-3
