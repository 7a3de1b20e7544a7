"""fuse-activation: an activation written as a formula becomes torch's one-kernel module,
matched by what it computes; checked, reversible, and the audit's finding is gone."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gpushape import audit
from gpushape.transforms import optimize, revert
from gpushape.transforms.fuse_activation import match


class TanhGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class AlmostGELU(nn.Module):
    """The tanh formula with another constant: not GELU, must not be replaced."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.8 * (x + 0.044715 * x**3)))


class MLP(nn.Module):
    def __init__(self, act: nn.Module, width: int = 64):
        super().__init__()
        self.up, self.act, self.down = nn.Linear(width, 4 * width), act, nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def test_matched_by_what_it_computes():
    assert match(TanhGELU())[0] == "nn.GELU(approximate='tanh')"
    assert match(Swish())[0] == "nn.SiLU()"
    assert match(AlmostGELU()) is None
    assert match(nn.GELU()) is None  # torch's own: nothing to do
    assert match(nn.Linear(4, 4)) is None


@pytest.mark.parametrize(("act", "found"), [(TanhGELU, True), (Swish, False)])
def test_swapped_checked_reverted_and_the_finding_gone(act, found):
    """(x * sigmoid(x) is two kernels, under the rule's three: swapped when asked, not found.)"""
    torch.manual_seed(0)
    model = nn.Sequential(MLP(act()), MLP(act()))
    x = torch.randn(8, 16, 64)
    want = model(x)
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32,
                             transforms=["fuse-activation"])  # fmt: skip
    assert report.verified["fuse-activation"].passed
    assert [c.module for c in report.applied] == ["0.act", "1.act"]
    assert type(model[0].act) in (nn.GELU, nn.SiLU)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    assert any(f.rule == "unfused-activation" for f in report.before.findings) is found
    assert not any(f.rule == "unfused-activation" for f in report.after.findings)
    _, again = optimize(model, (x,), gpu="h200", dtype=torch.float32,
                        transforms=["fuse-activation"])  # fmt: skip
    assert not again.applied  # twice equals once
    model = revert(model)
    assert type(model[0].act) is act and type(model[1].act) is act


def test_a_hooked_activation_is_refused_and_a_shared_one_swapped_everywhere():
    shared = TanhGELU()
    model = nn.Sequential(MLP(shared), MLP(shared))
    _, report = optimize(model, (torch.randn(4, 64),), gpu="h200", dtype=torch.float32,
                         transforms=["fuse-activation"])  # fmt: skip
    assert model[0].act is model[1].act and type(model[0].act) is nn.GELU
    assert "other place" in report.applied[0].detail
    hooked = nn.Sequential(MLP(TanhGELU()))
    hooked[0].act.register_forward_hook(lambda m, i, o: None)
    _, report = optimize(hooked, (torch.randn(4, 64),), gpu="h200", dtype=torch.float32,
                         transforms=["fuse-activation"])  # fmt: skip
    assert not report.applied and "hooks" in report.refused[0].reason


def test_the_rule_prices_gpt2_and_compile_mode_drops_it():
    x = torch.randn(8, 1024, 768, device="meta")
    model = nn.Sequential(*[MLP(TanhGELU(), 768) for _ in range(2)])
    eager = audit(model, (x,), "h200", train=True)
    finding = next(f for f in eager.findings if f.rule == "unfused-activation")
    assert finding.fix == "fuse-activation" and finding.evidence["sites"] == 2
    assert finding.evidence["ops_per_site_forward"] >= 7
    assert 0 < finding.est_saving_s < eager.totals.kernel_time_s
    compiled = audit(model, (x,), "h200", train=True, mode="compile")
    done = next(f for f in compiled.findings if f.rule == "unfused-activation")
    assert done.est_saving_s == 0.0 and "Inductor" in done.message


def test_hugging_face_gpt2_gelu_new():
    pytest.importorskip("transformers")
    from .nets import tiny_gpt2

    model = tiny_gpt2()
    ids = torch.randint(0, 128, (2, 32))
    model, report = optimize(model, (ids,), gpu="h200", dtype=torch.float32,
                             transforms=["fuse-activation"])  # fmt: skip
    assert report.verified["fuse-activation"].passed
    assert {c.module for c in report.applied} == {"transformer.h.0.mlp.act",
                                                  "transformer.h.1.mlp.act"}  # fmt: skip
