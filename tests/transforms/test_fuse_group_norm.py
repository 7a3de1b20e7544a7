"""fuse-group-norm: nn.GroupNorm and timm's group norms become gpushape's GroupNormAct, with the
activation that is a norm's only reader folded in: the same outputs and gradients, the same
Parameters and state_dict, reversible, refused where hooked; the audit's slow-group-norm finding
fires, is quiet under torch.compile, and is gone after the fix. And every transform runs in
_picking.ORDER, before graph-layers. timm's norms and ResNet-GN: test_fuse_group_norm_timm.py."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch.nn import functional as F

from gpushape import audit
from gpushape.auditing.finding import Severity
from gpushape.kernels import GroupNormAct
from gpushape.transforms import applied, optimize, revert
from gpushape.transforms._core import load_transforms
from gpushape.transforms._picking import ORDER

ID, RULE = "fuse-group-norm", "slow-group-norm"


class Block(nn.Module):
    """A conv, a group norm and what reads it: `act` alone (folded), or (two_users) the act
    and the residual both, which leaves the act where it is."""

    def __init__(self, norm: nn.Module | None = None, act: nn.Module | None = None,
                 two_users: bool = False):  # fmt: skip
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16) if norm is None else norm
        self.act = nn.ReLU() if act is None else act
        self.two_users = two_users

    def forward(self, x):
        y = self.norm(self.conv(x))
        return self.act(y) + y if self.two_users else self.act(y)


def _trained_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights and biases drawn at random (not ones and zeros), so a swapped-in parameter that
    is not the norm's own would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.GroupNorm) and m.affine:
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=g))
    return model


def _block(**kw) -> Block:
    torch.manual_seed(0)
    return _trained_like(Block(**kw))


def _grads(model, x):
    x = x.detach().clone().requires_grad_()
    model.zero_grad()
    out = model(x)
    out.backward(torch.randn_like(out, generator=torch.Generator().manual_seed(1)))
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def _optimize(model, x, **kw):
    return optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=[ID], **kw)


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert len(got[2]) == len(want[2])
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _checked_swap(model: nn.Module, x: torch.Tensor):
    """optimize(fuse-group-norm) on `model`: same function, Parameters and checkpoint, twice
    equals once. The optimized model and the report."""
    want = _grads(model, x)
    params = dict(model.named_parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimized, report = _optimize(model, x)
    assert report.verified[ID].passed and not report.rolled_back
    assert all(c.transform == ID for c in report.applied)
    assert dict(optimized.named_parameters()) == params  # the very Parameter objects
    after = optimized.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    _assert_same(_grads(optimized, x), want)
    again, report2 = _optimize(optimized, x)
    assert again is optimized and not report2.applied  # twice equals once
    return optimized, report


@pytest.mark.parametrize("inplace", [False, True])
def test_conv_group_norm_relu_fused_and_reverted(inplace):
    model, x = _block(act=nn.ReLU(inplace=inplace)), torch.randn(2, 3, 8, 8)
    norm, weight = model.norm, model.norm.weight
    optimized, report = _checked_swap(model, x)
    assert [c.module for c in report.applied] == ["norm"]
    assert "GroupNorm + ReLU fused" in report.applied[0].detail
    new = optimized.norm
    assert type(new) is GroupNormAct and new.activation == "relu"
    assert new.weight is weight and new.bias is norm.bias
    assert (new.num_groups, new.num_channels, new.eps) == (4, 16, norm.eps)
    # the activation's call is gone from the rewritten forward (its module may stay, unused)
    assert isinstance(optimized, fx.GraphModule)
    called = [n.target for n in optimized.graph.nodes if n.op == "call_module"]
    assert called == ["conv", "norm"]
    restored = revert(optimized)
    assert restored is model and not applied(restored)
    assert type(restored) is Block and restored.norm is norm and type(restored.act) is nn.ReLU
    assert dict(restored.named_parameters())["norm.weight"] is weight


def test_two_readers_no_folding_a_plain_swap():
    model, x = _block(two_users=True), torch.randn(2, 3, 6, 7)
    optimized, report = _checked_swap(model, x)
    assert [c.module for c in report.applied] == ["norm"]
    assert "-> gpushape GroupNormAct" in report.applied[0].detail
    assert type(optimized) is Block  # no fx rewrite
    assert type(optimized.norm) is GroupNormAct and optimized.norm.activation == "none"
    assert type(optimized.act) is nn.ReLU
    restored = revert(optimized)
    assert type(restored.norm) is nn.GroupNorm


def test_identity_between_norm_and_act_is_folded_through():
    """timm's ResNet calls drop_block, an nn.Identity unless drop_block_rate is set, between
    bn2 and act2: the norm and the activation fuse, the Identity stays after them."""

    class ThroughIdentity(Block):
        def __init__(self):
            super().__init__(act=nn.SiLU())
            self.drop = nn.Identity()

        def forward(self, x):
            return self.act(self.drop(self.norm(self.conv(x))))

    torch.manual_seed(0)
    model, x = _trained_like(ThroughIdentity()), torch.randn(2, 3, 5, 5)
    optimized, report = _checked_swap(model, x)
    assert [c.module for c in report.applied] == ["norm"]
    assert optimized.norm.activation == "silu"
    called = [n.target for n in optimized.graph.nodes if n.op == "call_module"]
    assert called == ["conv", "norm", "drop"]
    assert type(revert(optimized).norm) is nn.GroupNorm


def test_a_hooked_norm_is_refused_and_a_subclass_left_alone():
    x = torch.randn(1, 3, 4, 4)
    hooked = _block()
    hooked.norm.register_forward_hook(lambda m, i, o: None)
    optimized, report = _optimize(hooked, x)
    assert not report.applied and report.refused
    assert all("hook" in r.reason for r in report.refused)
    assert type(optimized.norm) is nn.GroupNorm

    class MyGroupNorm(nn.GroupNorm):  # may compute something else: not ours to swap
        pass

    model = _block(norm=MyGroupNorm(4, 16))
    optimized, report = _optimize(model, x)
    assert not report.applied and not report.refused
    assert type(optimized.norm) is MyGroupNorm


def test_a_norm_called_twice_is_not_folded():
    class Twice(Block):
        def forward(self, x):
            return self.act(self.norm(self.norm(self.conv(x))))

    torch.manual_seed(0)
    model, x = _trained_like(Twice()), torch.randn(2, 3, 4, 4)
    optimized, report = _checked_swap(model, x)
    assert any("more than once" in r.reason for r in report.refused)
    assert type(optimized.norm) is GroupNormAct and optimized.norm.activation == "none"


def test_a_functional_activation_an_untraceable_parent_and_no_affine():
    class Functional(Block):
        def forward(self, x):
            return F.silu(self.norm(self.conv(x)))

    class Untraceable(Block):  # fx cannot branch on a shape: the norm is swapped on its own
        def forward(self, x):
            y = self.norm(self.conv(x))
            return self.act(y) if y.shape[0] > 0 else y

    x = torch.randn(2, 3, 4, 5)
    torch.manual_seed(0)
    optimized, report = _checked_swap(_trained_like(Functional()), x)
    assert optimized.norm.activation == "silu" and "SiLU fused" in report.applied[0].detail
    torch.manual_seed(0)
    optimized, report = _checked_swap(_trained_like(Untraceable()), x)
    assert type(optimized) is Untraceable and optimized.norm.activation == "none"
    optimized, report = _checked_swap(_block(norm=nn.GroupNorm(4, 16, affine=False)), x)
    assert optimized.norm.activation == "relu" and optimized.norm.weight is None


def test_a_hooked_parent_keeps_its_forward_and_gets_a_plain_swap():
    model, x = _block(), torch.randn(2, 3, 4, 4)
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append(o))
    optimized, report = _checked_swap(model, x)
    assert optimized is model and type(model.norm) is GroupNormAct
    assert model.norm.activation == "none" and type(model.act) is nn.ReLU
    assert any("hook" in r.reason for r in report.refused)
    seen.clear(), model(x)
    assert len(seen) == 1


def test_a_hooked_activation_is_not_folded():
    """Its hook keeps running: the norm is swapped alone, the activation stays a module."""
    model, x = _block(), torch.randn(2, 3, 4, 4)
    seen = []
    model.act.register_forward_hook(lambda m, i, o: seen.append(o))
    optimized, _ = _optimize(model, x)
    seen.clear(), optimized(x)
    assert len(seen) == 1


def test_with_fuse_norm_act_in_the_same_parent():
    """A parent holding a BatchNorm -> ReLU and a GroupNorm -> ReLU: fuse-norm-act rewrites it
    with fx first, fuse-group-norm rewrites that GraphModule again; revert undoes both."""

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn, self.act1 = (
                nn.Conv2d(3, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
            )
            self.conv2, self.gn, self.act2 = (
                nn.Conv2d(8, 8, 3, padding=1),
                nn.GroupNorm(2, 8),
                nn.ReLU(),
            )

        def forward(self, x):
            return self.act2(self.gn(self.conv2(self.act1(self.bn(self.conv1(x))))))

    torch.manual_seed(0)
    model, x = _trained_like(Both()), torch.randn(2, 3, 6, 6)
    want = _grads(model, x)
    both = ["fuse-norm-act", ID]
    optimized, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=both)
    assert {(c.transform, c.module) for c in report.applied} == {
        ("fuse-norm-act", "bn"),
        (ID, "gn"),
    }
    assert all(report.verified[t].passed for t in both)
    assert type(optimized.gn) is GroupNormAct and optimized.gn.activation == "relu"
    called = [n.target for n in optimized.graph.nodes if n.op == "call_module"]
    assert called == ["conv1", "bn", "conv2", "gn"]
    _assert_same(_grads(optimized, x), want)
    restored = revert(optimized)
    assert restored is model and type(model.gn) is nn.GroupNorm and type(model.bn) is nn.BatchNorm2d


# ---- the audit ------------------------------------------------------------------------------
def _meta_block(**kw):
    with torch.device("meta"):
        model = Block(**kw)
    return model, torch.empty(64, 3, 56, 56, device="meta")


def _found(report):
    return [f for f in report.findings if f.rule == RULE]


def test_the_rule_fires_with_the_fix_and_is_quiet_under_compile():
    model, x = _meta_block()
    (found,) = _found(audit(model, (x,), "h200", train=True))
    assert found.fix == ID and found.module == "norm" and found.est_saving_s > 0
    ev = found.evidence
    assert ev["norms"] == 1 and ev["with_activation"] == 1 and ev["groups"] == [4]
    assert 0 < ev["time_kernel_s"] < ev["time_pytorch_s"]
    (quiet,) = _found(audit(model, (x,), "h200", train=True, mode="compile"))
    assert quiet.fix == ID and quiet.est_saving_s == 0 and quiet.severity is Severity.INFO
    assert "Inductor writes its own group-norm kernels" in quiet.message


def test_a_look_alike_gets_a_finding_without_the_fix():
    class GroupNorm(nn.GroupNorm):  # the name the trace matches, another class
        pass

    with torch.device("meta"):
        model = nn.Sequential(Block(), Block(norm=GroupNorm(4, 16)))
        model[1].conv = nn.Conv2d(16, 16, 3, padding=1)
    x = torch.empty(64, 3, 56, 56, device="meta")
    found = {f.module: f for f in _found(audit(model, (x,), "h200", train=True))}
    assert found["0.norm"].fix == ID
    other = found["1.norm"]
    assert other.fix is None and other.evidence["module_class"].endswith("GroupNorm")
    assert "fuse-group-norm" in other.message and "GroupNormAct.from_module" in other.message


def test_the_finding_is_gone_after_the_fix():
    model, x = _block(), torch.randn(2, 3, 8, 8)
    assert [f.fix for f in _found(audit(model, (x,), "h200", train=True))] == [ID]
    optimized, report = _optimize(model, x)
    assert _found(report.before) and not _found(report.after)
    assert not _found(audit(optimized, (x,), "h200", train=True))


def test_optimize_in_compile_mode_leaves_the_norms():
    model, x = _block(), torch.randn(2, 3, 8, 8)
    optimized, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, mode="compile")
    assert not any(c.transform == ID for c in report.applied)
    assert type(optimized.norm) is nn.GroupNorm


# ---- the order optimize applies transforms in -----------------------------------------------
def test_every_transform_is_ordered_before_graph_layers():
    """A transform missing from ORDER runs after graph-layers, which captures the layers at
    transform time: a module it swaps inside a captured layer would silently do nothing."""
    last = {"graph-layers", "activation-checkpoint"}  # applied after ORDER, on purpose
    missing = sorted(set(load_transforms()) - set(ORDER) - last)
    assert not missing, f"add {missing} to transforms/_picking.py's ORDER"
    assert not last & set(ORDER)
    assert "fuse-group-norm" in ORDER
