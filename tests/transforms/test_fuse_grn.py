"""fuse-grn: timm's GlobalResponseNorm and Hugging Face's ConvNextV2GRN become gpushape's
GlobalResponseNorm: the same outputs and gradients, the same Parameters and state_dict,
reversible, refused where hooked; the audit's unfused-grn finding fires, is priced, is quiet
under torch.compile, and is gone after the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape import audit
from gpushape.kernels import GlobalResponseNorm
from gpushape.tracing.families import memory_family
from gpushape.tracing.tracer import trace
from gpushape.transforms import optimize, revert

timm_grn = pytest.importorskip("timm.layers.grn")


class Block(nn.Module):
    """ConvNeXt-V2's MLP as timm writes it: Linear, GELU, GRN, Linear over (N, H, W, C)."""

    def __init__(self, grn: nn.Module, c: int = 8, hidden: int = 32):
        super().__init__()
        self.fc1, self.act, self.grn, self.fc2 = (
            nn.Linear(c, hidden),
            nn.GELU(),
            grn,
            nn.Linear(hidden, c),
        )

    def forward(self, x):
        return x + self.fc2(self.grn(self.act(self.fc1(x))))


def _timm_block():
    torch.manual_seed(0)
    block = Block(timm_grn.GlobalResponseNorm(32))
    nn.init.normal_(block.grn.weight), nn.init.normal_(block.grn.bias)  # trained-like, not zeros
    return block


def _grads(model, x):
    x = x.detach().clone().requires_grad_()
    model.zero_grad()
    out = model(x)
    out.backward(torch.randn_like(out, generator=torch.Generator().manual_seed(1)))
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def _optimize(model, x):
    return optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=["fuse-grn"])


def test_timm_grn_swapped_equal_outputs_and_gradients_and_reverted():
    model, x = _timm_block(), torch.randn(2, 5, 6, 8)
    want = _grads(model, x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model.grn.weight
    model, report = _optimize(model, x)
    assert [c.module for c in report.applied] == ["grn"]
    assert report.verified["fuse-grn"].passed
    assert type(model.grn) is GlobalResponseNorm and model.grn.weight is weight
    got = _grads(model, x)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    _, again = _optimize(model, x)
    assert not again.applied  # twice equals once
    model = revert(model)
    assert type(model.grn) is timm_grn.GlobalResponseNorm


def test_hugging_face_grn_keeps_its_parameter_shape():
    hf = pytest.importorskip("transformers.models.convnextv2.modeling_convnextv2")
    torch.manual_seed(0)
    model = Block(hf.ConvNextV2GRN(32))
    nn.init.normal_(model.grn.weight), nn.init.normal_(model.grn.bias)
    x = torch.randn(2, 4, 3, 8)
    want = _grads(model, x)
    model, report = _optimize(model, x)
    assert [c.module for c in report.applied] == ["grn"] and report.verified["fuse-grn"].passed
    assert model.grn.weight.shape == (1, 1, 1, 32)
    got = _grads(model, x)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[2], want[2]):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_a_hooked_grn_and_a_subclass_are_left_alone():
    class MyGRN(timm_grn.GlobalResponseNorm):
        pass

    x = torch.randn(1, 3, 3, 8)
    model = Block(MyGRN(32))
    _, report = _optimize(model, x)
    assert not report.applied and not report.refused
    hooked = _timm_block()
    hooked.grn.register_forward_hook(lambda m, i, o: None)
    _, report = _optimize(hooked, x)
    assert not report.applied and "hooks" in report.refused[0].reason


def test_a_look_alike_gets_a_finding_without_the_fix():
    """A subclass of timm's GRN (the same name, maybe another function) beside timm's own: two
    findings, fuse-grn for timm's module, none for the subclass, whose message says why and
    how to use the kernels by hand."""

    class GlobalResponseNorm(timm_grn.GlobalResponseNorm):  # the name the trace matches
        pass

    model = nn.Sequential(Block(timm_grn.GlobalResponseNorm(32)), Block(GlobalResponseNorm(32)))
    x = torch.empty(64, 56, 56, 8, device="meta")
    found = {f.module: f for f in audit(model, (x,), "h200", train=True).findings}
    assert found["0.grn"].fix == "fuse-grn" and "leaves it" not in found["0.grn"].message
    other = found["1.grn"]
    assert other.rule == "unfused-grn" and other.fix is None and other.est_saving_s > 0
    assert other.evidence["module_class"].endswith("GlobalResponseNorm")
    assert "fuse-grn leaves it" in other.message
    assert "gpushape.kernels.GlobalResponseNorm(dim, eps, channels_last)" in other.message


def _convnextv2(**kw):
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        model = timm.create_model("convnextv2_atto", **kw).to(torch.bfloat16)
    return model, torch.empty(32, 3, 224, 224, dtype=torch.bfloat16, device="meta")


def test_the_rule_prices_convnextv2_eager_is_quiet_compiled_and_after_the_fix():
    model, x = _convnextv2()
    eager = audit(model, (x,), "h200", train=True)
    found = next(f for f in eager.findings if f.rule == "unfused-grn")
    assert found.fix == "fuse-grn" and found.module == "stages.*.blocks.*.mlp.grn"
    ev = found.evidence
    assert ev["modules"] == 12  # convnextv2_atto: depths (2, 2, 6, 2), a GRN a block
    assert 0 < ev["time_kernel_s"] < ev["time_pytorch_s"]
    assert found.est_saving_s == pytest.approx(ev["time_pytorch_s"] - ev["time_kernel_s"])
    compiled = audit(model, (x,), "h200", train=True, mode="compile")
    quiet = next(f for f in compiled.findings if f.rule == "unfused-grn")
    assert quiet.est_saving_s == 0 and "Inductor fuses the GRN" in quiet.message
    for fqn, m in list(model.named_modules()):
        if isinstance(m, timm_grn.GlobalResponseNorm):
            parent, _, name = fqn.rpartition(".")
            setattr(model.get_submodule(parent), name, GlobalResponseNorm.from_module(m))
    after = audit(model, (x,), "h200", train=True)
    assert not any(f.rule == "unfused-grn" for f in after.findings)
    traced = trace(model, (x,), train=True)
    grns = [r for r in traced.ops if "global_response_norm" in r.op]
    assert len(grns) == 2 * ev["modules"]  # forward and backward
    assert {memory_family(r) for r in grns} == {"fused_grn"}


def test_no_grn_no_finding():
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        model = timm.create_model("convnext_atto").to(torch.bfloat16)  # ConvNeXt (v1): no GRN
    x = torch.empty(8, 3, 224, 224, dtype=torch.bfloat16, device="meta")
    assert not any(f.rule == "unfused-grn" for f in audit(model, (x,), "h200", train=True).findings)


def test_hugging_face_convnextv2_model():
    """transformers' ConvNextV2 built small on the CPU: every GRN swapped and checked, the
    checkpoint unchanged both ways, the audit's finding gone, revert exact."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ConvNextV2Config(
        depths=[1, 1, 1, 1], hidden_sizes=[16, 24, 32, 40], num_labels=5, image_size=64
    )
    torch.manual_seed(0)
    model = transformers.ConvNextV2ForImageClassification(cfg)
    for m in model.modules():
        if type(m).__name__ == "ConvNextV2GRN":
            nn.init.normal_(m.weight), nn.init.normal_(m.bias)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 64, 64)
    optimized, report = optimize(
        model, (x,), gpu="h200", dtype=torch.float32, transforms=["fuse-grn"]
    )
    assert len(report.applied) == 4 and report.verified["fuse-grn"].passed
    assert all(type(c.module) is str and c.module.endswith(".grn") for c in report.applied)
    sd = optimized.state_dict()
    assert sd.keys() == original.keys() and all(torch.equal(sd[k], v) for k, v in original.items())
    assert not any(f.rule == "unfused-grn" for f in report.after.findings)
    assert any(f.rule == "unfused-grn" for f in report.before.findings)
    restored = revert(optimized)
    assert all(type(m).__name__ != "GlobalResponseNorm" for m in restored.modules())
