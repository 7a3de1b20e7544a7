"""fuse-norm-act with SiLU, GELU and Hardswish, and timm's BatchNormAct2d: the sites found from
the traced data flow (module, function and method forms), refused with a reason where they
cannot be fused, same function and state_dict, reversible, idempotent; and the audit rule
unfused-norm-act fires exactly where the transform can fuse (ReLU's own cases:
test_fuse_norm_act.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.auditing import audit
from gpushape.kernels import BatchNormAct2d as Fused
from gpushape.transforms import TransformContext, applied, get_transform, optimize, revert
from gpushape.transforms._core import remember

C = 8


class GELUModule(nn.Module):
    """An activation module of a library's own whose forward is just F.gelu (timm's GELU)."""

    def forward(self, x):
        return F.gelu(x)


class Swish(nn.Module):
    """SiLU written as its formula: not the function, so not fused here (fuse-activation's)."""

    def forward(self, x):
        return x * torch.sigmoid(x)


# how a net applies its activation -> the kernel's activation (None: not fusable)
FORMS = {
    "nn.SiLU": (lambda: nn.SiLU(), "silu"),
    "nn.SiLU(inplace)": (lambda: nn.SiLU(inplace=True), "silu"),
    "F.silu": (lambda: F.silu, "silu"),
    "nn.GELU": (lambda: nn.GELU(), "gelu"),
    "F.gelu": (lambda: F.gelu, "gelu"),
    "F.gelu(tanh)": (lambda: lambda t: F.gelu(t, approximate="tanh"), "gelu_tanh"),
    "nn.GELU(tanh)": (lambda: nn.GELU(approximate="tanh"), "gelu_tanh"),
    "library GELU": (lambda: GELUModule(), "gelu"),
    "nn.Hardswish": (lambda: nn.Hardswish(), "hardswish"),
    "F.hardswish": (lambda: F.hardswish, "hardswish"),
    "nn.LeakyReLU": (lambda: nn.LeakyReLU(), None),
    "nn.Mish": (lambda: nn.Mish(), None),
    "nn.ReLU6": (lambda: nn.ReLU6(), None),
    "Swish formula": (lambda: Swish(), None),
}


class ConvBNAct(nn.Module):
    """conv -> BatchNorm2d [-> + x] -> act, the act given as a module or a function."""

    def __init__(self, act, residual: bool = False):
        super().__init__()
        # declared act first: the transform must follow the data, not the declaration order
        self.act = act if isinstance(act, nn.Module) else None
        self.fn = None if isinstance(act, nn.Module) else act
        self.conv = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(C)
        self.residual = residual

    def forward(self, x):
        y = self.bn(self.conv(x))
        if self.residual:
            y = y + x
        return self.act(y) if self.act is not None else self.fn(y)


class ActReadsAnotherBranch(nn.Module):
    """A SiLU module next to a BatchNorm whose output it never reads: nothing to fuse."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(C)
        self.act = nn.SiLU()
        self.conv = nn.Conv2d(C, C, 1)

    def forward(self, x):
        return self.bn(x) + self.act(self.conv(x))


class BatchNormAct2d(nn.BatchNorm2d):
    """The structure of timm's timm.layers.norm_act.BatchNormAct2d, written here (timm is not a
    dependency): a BatchNorm2d whose forward normalises as nn.BatchNorm2d, then runs `drop`
    and `act` on the result."""

    def __init__(self, num_features, act=None, drop=None, momentum=0.1):
        super().__init__(num_features, momentum=momentum)
        self.drop = drop if drop is not None else nn.Identity()
        self.act = act if act is not None else nn.ReLU(inplace=True)

    def forward(self, x):
        torch._assert(x.ndim == 4, "expected a 4-D input")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        x = F.batch_norm(
            x,
            self.running_mean if keep else None,
            self.running_var if keep else None,
            self.weight,
            self.bias,
            use_batch,
            factor,
            self.eps,
        )
        return self.act(self.drop(x))


def _library_net(**kwargs) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(C, C, 3, padding=1, bias=False), BatchNormAct2d(C, **kwargs))


def _images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, C, 6, 6)


def _apply(model: nn.Module):
    ctx = TransformContext(example_inputs=(_images(),))
    outcome = get_transform("fuse-norm-act").apply(model, ctx)
    root = outcome.root or model
    remember(root, outcome.changes)
    return root, outcome


def _fused(model: nn.Module) -> list[tuple[str, str]]:
    return [(n, m.activation) for n, m in model.named_modules() if isinstance(m, Fused)]


def _outputs_and_grads(model: nn.Module, x: torch.Tensor):
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(torch.randn_like(y, generator=torch.Generator().manual_seed(1)))
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return y.detach(), x.grad, grads


def _assert_same_function(original: nn.Module, rewritten: nn.Module):
    """Outputs, input and parameter gradients in training (two steps: the running stats
    move) and eval, and the state_dict afterwards."""
    for train in (True, True, False):
        x = _images()
        a = _outputs_and_grads(original.train(train), x)
        b = _outputs_and_grads(rewritten.train(train), x)
        for u, v in zip((a[0], a[1], *a[2]), (b[0], b[1], *b[2])):
            torch.testing.assert_close(v, u, rtol=1e-4, atol=1e-5)
    for key, value in original.state_dict().items():
        torch.testing.assert_close(rewritten.state_dict()[key], value, rtol=1e-6, atol=1e-6)


def _unfused_findings(model: nn.Module) -> list:
    report = audit(model, (_images(),), gpu="h200", rules=["unfused-norm-act"])
    return report.findings


# ---- parent-level patterns ----


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("form", list(FORMS))
def test_each_activation_form_is_fused_or_left_alone(form, residual):
    make, expected = FORMS[form]
    torch.manual_seed(0)
    model = ConvBNAct(make(), residual)
    original = copy.deepcopy(model)
    keys = list(model.state_dict())
    fires = bool(_unfused_findings(copy.deepcopy(model)))
    rewritten, outcome = _apply(model)
    assert fires == (expected is not None), "the rule must promise exactly what is fused"
    if expected is None:
        assert not outcome.changes and not _fused(rewritten) and not outcome.refusals
        return
    assert _fused(rewritten) == [("bn", expected)]
    (change,) = outcome.changes
    assert ("residual add" in change.detail) == residual
    assert list(rewritten.state_dict()) == keys
    rewritten.load_state_dict(original.state_dict(), strict=True)
    _assert_same_function(original, rewritten)
    assert not _unfused_findings(rewritten)  # fixed: the rule no longer fires


def test_the_data_flow_not_the_declared_modules_decides():
    model, outcome = _apply(ActReadsAnotherBranch())
    assert not outcome.changes and not _fused(model) and not outcome.refusals


def test_an_intermediate_with_two_users_is_refused():
    class TwoUsers(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(C)

        def forward(self, x):
            y = self.bn(x)
            return F.hardswish(y) + y

    _, outcome = _apply(TwoUsers())
    assert not outcome.changes
    assert any("other users" in r.reason for r in outcome.refusals)


def test_revert_and_twice_equals_once():
    model = nn.Sequential(ConvBNAct(nn.SiLU()), ConvBNAct(F.gelu, residual=True))
    blocks = list(model)
    rewritten, first = _apply(model)
    again, second = _apply(rewritten)
    assert len(first.changes) == 2 and not second.changes and again is rewritten
    assert sorted(a for _, a in _fused(rewritten)) == ["gelu", "silu"]
    restored = revert(rewritten)
    assert restored is model and list(restored) == blocks and not _fused(restored)
    assert not applied(restored)


def test_optimize_fuses_verifies_and_clears_the_finding(interpret):
    """The whole loop on a SiLU net: audit finds it, the rewrite passes the numeric gate
    (fused kernels in the interpreter against float64), the audit after is quiet."""
    torch.manual_seed(0)
    model = nn.Sequential(ConvBNAct(nn.SiLU(inplace=True)), ConvBNAct(nn.Hardswish(), True))
    fused, report = optimize(model, (_images(),), dtype=torch.float32, transforms=["fuse-norm-act"])
    assert report.verified["fuse-norm-act"].passed and not report.rolled_back
    assert sorted(a for _, a in _fused(fused)) == ["hardswish", "silu"]
    assert any(f.rule == "unfused-norm-act" for f in report.before.findings)
    assert not any(f.rule == "unfused-norm-act" for f in report.after.findings)


def test_layer_norm_takes_gelu_only():
    class LNThen(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.norm, self.act = nn.LayerNorm(16), act

        def forward(self, x):
            return self.act(self.norm(x))

    for act, fused in ((nn.GELU(approximate="tanh"), True), (nn.SiLU(), False)):
        x = torch.randn(2, 4, 16)
        outcome = get_transform("fuse-norm-act").apply(
            LNThen(act), TransformContext(example_inputs=(x,))
        )
        assert bool(outcome.changes) == fused
        findings = audit(LNThen(act), (x,), gpu="h200", rules=["unfused-norm-act"]).findings
        assert bool(findings) == fused


def test_group_norm_then_silu_is_not_promised():
    net = nn.Sequential(nn.Conv2d(C, C, 1), nn.GroupNorm(2, C), nn.SiLU())
    assert not _unfused_findings(net)
    _, outcome = _apply(net)
    assert not outcome.changes


# ---- library modules: timm's BatchNormAct2d (its structure, written here) ----


@pytest.mark.parametrize(
    ("act", "expected"),
    [
        (nn.SiLU(inplace=True), "silu"),
        (nn.ReLU(inplace=True), "relu"),
        (GELUModule(), "gelu"),
        (nn.GELU(approximate="tanh"), "gelu_tanh"),
        (nn.Hardswish(), "hardswish"),
    ],
    ids=["silu", "relu", "library-gelu", "gelu-tanh", "hardswish"],
)
def test_library_norm_act_module_is_swapped(act, expected):
    torch.manual_seed(0)
    model = _library_net(act=act)
    original = copy.deepcopy(model)
    keys = list(model.state_dict())
    assert _unfused_findings(copy.deepcopy(model))
    rewritten, outcome = _apply(model)
    assert rewritten is model and _fused(model) == [("1", expected)]
    (change,) = outcome.changes
    assert change.module == "1" and "BatchNormAct2d" in change.detail
    assert list(model.state_dict()) == keys
    _assert_same_function(original, model)
    assert not _unfused_findings(model)
    _, second = _apply(model)
    assert not second.changes and not second.refusals
    restored = revert(model)
    assert type(restored[1]) is BatchNormAct2d and not _fused(restored)


def test_library_module_shares_parameters_buffers_and_keeps_the_count():
    """Tracing its forward in training runs its num_batches_tracked.add_(1) for real: undone
    (cumulative momentum=None too, whose float(count) traces only because of that)."""
    model = _library_net(act=nn.SiLU(), momentum=None)
    bn = model[1]
    params = dict(model.named_parameters())
    _apply(model)
    assert int(model[1].num_batches_tracked) == 0
    assert dict(model.named_parameters()) == params
    assert model[1].running_mean is bn.running_mean and model[1].momentum is None


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(act=nn.SiLU(), drop=nn.Dropout(0.1)), "its drop (Dropout)"),
        (dict(act=nn.LeakyReLU()), "LeakyReLU is not one BatchNormAct2d fuses"),
        (dict(act=Swish()), "Swish is not one"),
    ],
)
def test_library_module_refused_with_the_reason(kwargs, says):
    model, outcome = _apply(_library_net(**kwargs))
    assert not outcome.changes and not _fused(model)
    (refusal,) = outcome.refusals
    assert refusal.module == "1" and says in refusal.reason, refusal
    assert not _unfused_findings(_library_net(**kwargs))


def test_library_module_without_activation_is_left_alone():
    """act=nn.Identity (timm's apply_act=False) is a plain BatchNorm: no change, no refusal."""
    model, outcome = _apply(_library_net(act=nn.Identity()))
    assert not outcome.changes and not outcome.refusals and not _fused(model)


def test_library_module_with_a_hook_or_held_twice_is_refused():
    model = _library_net(act=nn.SiLU())
    model[1].act.register_forward_hook(lambda m, i, o: None)
    _, outcome = _apply(model)
    assert not outcome.changes and "hook" in outcome.refusals[0].reason
    shared = BatchNormAct2d(C, act=nn.SiLU())
    _, outcome = _apply(nn.Sequential(shared, nn.Conv2d(C, C, 1), shared))
    assert not outcome.changes and "more than one place" in outcome.refusals[0].reason


# ---- timm itself, where installed ----


@pytest.mark.parametrize("act_layer", ["silu", "gelu", "hard_swish", "relu"])
def test_real_timm_batch_norm_act(act_layer):
    timm_layers = pytest.importorskip("timm.layers")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(C, C, 3, padding=1, bias=False),
        timm_layers.BatchNormAct2d(C, act_layer=act_layer),
        timm_layers.BatchNormAct2d(C, apply_act=False),  # a plain BatchNorm: left alone
    )
    original = copy.deepcopy(model)
    keys = list(model.state_dict())
    assert _unfused_findings(copy.deepcopy(model))
    rewritten, outcome = _apply(model)
    expected = {"silu": "silu", "gelu": "gelu", "hard_swish": "hardswish", "relu": "relu"}
    assert _fused(rewritten) == [("1", expected[act_layer])] and not outcome.refusals
    assert list(rewritten.state_dict()) == keys
    _assert_same_function(original, rewritten)
    assert not _unfused_findings(rewritten)
    with_drop = nn.Sequential(
        timm_layers.BatchNormAct2d(C, act_layer=act_layer, drop_layer=nn.Dropout)
    )
    _, outcome = _apply(with_drop)
    assert not outcome.changes and "its drop (Dropout)" in outcome.refusals[0].reason
