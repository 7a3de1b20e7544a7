"""safe-avg-pool: padded nn.AvgPool2d becomes LayoutSafeAvgPool2d (by name anywhere), the rest
refused with the reason; optimize applies it unasked, first and whatever the audit predicts,
exactly where the device's check finds pytorch#188344 (forced here: the CPU has no bug)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.kernels import LayoutSafeAvgPool2d
from gpushape.transforms import _optimize, optimize, revert, safe_avg_pool
from gpushape.transforms._core import TransformContext, get_transform

ID = "safe-avg-pool"


class MyPool(nn.AvgPool2d):
    """A subclass: it may compute something else, so it is not swapped."""


class Mixer(nn.Module):
    """PoolFormer's token mixer: pool(y) - y."""

    def __init__(self, pool: nn.Module):
        super().__init__()
        self.pool = pool

    def forward(self, x):
        return self.pool(x) - x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(1, 8)
        self.mix1 = Mixer(nn.AvgPool2d(3, 1, 1, count_include_pad=False))
        shared = nn.AvgPool2d(3, 1, 1)
        self.mix2, self.mix3 = Mixer(shared), Mixer(shared)  # one module held twice
        self.down = nn.AvgPool2d(2, 2)  # padding 0: PyTorch is right there
        self.mix4 = Mixer(MyPool(3, 1, 1))
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.norm(self.stem(x))
        y = self.mix3(self.mix2(self.mix1(y)))
        return self.head(self.mix4(self.down(y)))


def _net():
    torch.manual_seed(0)
    return Net(), torch.randn(2, 3, 8, 8)


@pytest.fixture
def broken(monkeypatch):
    """The device's check reports pytorch#188344."""
    monkeypatch.setattr(safe_avg_pool, "avg_pool_nhwc_backward_ok", lambda device: False)


def _ours(report):
    return [c for c in report.applied if c.transform == ID]


def test_by_name_swaps_only_exact_padded_pools_and_keeps_the_state():
    model, x = _net()
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=[ID])
    assert [c.module for c in _ours(report)] == ["mix1.pool", "mix2.pool"]
    assert "pytorch#188344" in _ours(report)[0].detail
    assert "(and 1 other place(s) holding it)" in _ours(report)[1].detail
    assert type(model.mix1.pool) is LayoutSafeAvgPool2d
    assert model.mix2.pool is model.mix3.pool and type(model.mix2.pool) is LayoutSafeAvgPool2d
    assert not model.mix1.pool.count_include_pad and model.mix2.pool.count_include_pad
    assert type(model.down) is nn.AvgPool2d and type(model.mix4.pool) is MyPool
    refused = {r.module: r.reason for r in report.refused if r.transform == ID}
    assert refused.keys() == {"down", "mix4.pool"}
    assert refused["down"].startswith("padding 0") and "subclasses" in refused["mix4.pool"]
    assert report.verified[ID].passed
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    _, again = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=[ID])
    assert not _ours(again)  # twice equals once
    model = revert(model)
    assert type(model.mix1.pool) is nn.AvgPool2d and type(model.mix3.pool) is nn.AvgPool2d


def test_hooks_and_filter_fn_are_respected():
    model, x = _net()
    model.mix1.pool.register_forward_hook(lambda *a: None)
    ctx = TransformContext(example_inputs=(x,), filter_fn=lambda m, fqn: fqn != "mix2.pool")
    out = get_transform(ID).apply(model, ctx)
    assert not out.changes
    assert any(r.module == "mix1.pool" and "hooks" in r.reason for r in out.refusals)


@pytest.mark.parametrize("asked", [None, ["channels-last"]], ids=["findings", "by-name"])
def test_optimize_applies_it_unasked_and_first_where_the_check_fails(broken, asked):
    model, x = _net()
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=asked)
    assert [c.module for c in _ours(report)] == ["mix1.pool", "mix2.pool"]
    assert report.applied[0].transform == ID  # before anything that changes a layout
    assert type(model.mix1.pool) is LayoutSafeAvgPool2d
    if asked:
        assert [c.transform for c in report.applied][-1] == "channels-last"


@pytest.mark.parametrize("asked", [None, ["channels-last"]], ids=["findings", "by-name"])
def test_optimize_leaves_the_pools_where_the_check_passes(asked):
    model, x = _net()
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=asked)
    assert not _ours(report) and ID not in report.verified
    assert type(model.mix1.pool) is nn.AvgPool2d


def test_optimize_does_not_apply_it_to_a_model_without_padded_pools(broken):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AvgPool2d(2))
    x = torch.randn(2, 3, 8, 8)
    assert not safe_avg_pool.needed(model, (x,))
    _, report = optimize(model, (x,), gpu="h200", dtype=torch.float32)
    assert not _ours(report) and not [r for r in report.refused if r.transform == ID]


def test_never_rolled_back_for_speed(broken, monkeypatch):
    """The speed guard would roll every picked transform back; the correctness guard stays."""
    monkeypatch.setattr(_optimize._Guard, "slower", lambda self, model: "predicted slower")
    model, x = _net()
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32)
    assert [c.module for c in _ours(report)] == ["mix1.pool", "mix2.pool"]
    assert ID not in {r.transform for r in report.rolled_back}
    assert type(model.mix1.pool) is LayoutSafeAvgPool2d


def test_poolformerv2_pools_all_swapped():
    timm = pytest.importorskip("timm")
    model = timm.create_model("poolformerv2_s12", pretrained=False)
    pools = [n for n, m in model.named_modules() if type(m) is nn.AvgPool2d]
    assert len(pools) == 12
    out = get_transform(ID).apply(model, TransformContext(example_inputs=()))
    assert [c.module for c in out.changes] == pools and not out.refusals
    assert all(type(model.get_submodule(n)) is LayoutSafeAvgPool2d for n in pools)


def test_the_benchs_channels_last_variant_guards_its_pools_where_the_check_fails(broken):
    """`gpushape bench --vs channels-last` converts the model outside optimize: its padded
    pools are guarded there too, with a note, and only where the device has the bug."""
    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.variants import build_variant

    model, x = _net()
    batch = synthetic_batch(model, (x,))
    variant = build_variant("channels-last", model, batch, optimizer="sgd")
    pools = [m for m in variant.step.model.modules() if isinstance(m, nn.AvgPool2d)]
    assert sum(isinstance(m, LayoutSafeAvgPool2d) for m in pools) == 2  # mix1 and the shared one
    assert any("pytorch#188344" in note for note in variant.notes)
    assert not any(isinstance(m, LayoutSafeAvgPool2d) for m in model.modules())  # a copy


def test_the_channels_last_variant_is_left_alone_where_the_check_passes():
    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.variants import build_variant

    model, x = _net()
    variant = build_variant("channels-last", model, synthetic_batch(model, (x,)), optimizer="sgd")
    assert not any(isinstance(m, LayoutSafeAvgPool2d) for m in variant.step.model.modules())
    assert not any("188344" in note for note in variant.notes)
