"""fuse-qkv: projections of one input merged into one GEMM; same outputs and gradients, the
original state_dict, reversible after training, idempotent, refused whole where unsafe."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from gpushape.hardware import get_gpu
from gpushape.transforms import TransformContext, get_transform, optimize, revert
from gpushape.transforms._fused_linear import FusedLinear, FusedSlice
from gpushape.transforms._verify import original_gradients

from .nets import BertStyleLayer, CrossAttention, GQABlock, tiny_bert, tiny_llama

FUSE = ["fuse-qkv"]


def _x(seed: int = 0, shape=(2, 16, 64)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))


def _optimize(model: nn.Module, inputs: tuple):
    return optimize(model, inputs, gpu="h200", dtype=torch.float32, transforms=FUSE)


def _apply(model: nn.Module, inputs: tuple, **options):
    """The transform alone (no audit, no numeric check)."""
    ctx = TransformContext(example_inputs=inputs, gpu=get_gpu("h200"), **options)
    return get_transform("fuse-qkv").apply(model, ctx)


def _shapes(state: dict) -> list:
    return [(k, tuple(v.shape)) for k, v in state.items()]


def _rules(report) -> set[str]:
    return {f.rule for f in report.findings}


def _first(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def _loss(model: nn.Module, inputs: tuple) -> torch.Tensor:
    return _first(model(*inputs)).pow(2).mean()


# ---- hand-written nets -----------------------------------------------------------------------
NETS = {
    "bert-layer": (BertStyleLayer, lambda: (_x(),), ["query/key/value"]),
    "gqa-block": (GQABlock, lambda: (_x(),), ["q_proj/k_proj/v_proj", "gate_proj/up_proj"]),
}


@pytest.mark.parametrize("net", NETS)
def test_fused_verified_and_the_finding_gone(net):
    build, inputs, groups = NETS[net]
    torch.manual_seed(0)
    model = build()
    original = copy.deepcopy(model)
    model, report = _optimize(model, inputs())
    assert report.verified["fuse-qkv"].passed and not report.rolled_back and not report.refused
    assert [c.detail.split(" -> ")[0] for c in report.applied] == groups
    assert "separate-qkv" in _rules(report.before) and "separate-qkv" not in _rules(report.after)
    fused = [m for m in model.modules() if isinstance(m, FusedLinear)]
    assert len(fused) == len(groups) and len(list(model.parameters())) < len(
        list(original.parameters())
    )
    x = _x(1)
    torch.testing.assert_close(model(x), original(x), rtol=1e-5, atol=1e-5)
    for m in (model, original):
        _loss(m, (x,)).backward()
    grads = original_gradients(model)
    for name, p in original.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert _shapes(model.state_dict()) == _shapes(original.state_dict())


def test_gqa_widths_and_state_dict():
    model = GQABlock()
    _apply(model, (_x(),))
    assert type(model.q_proj) is FusedSlice and model.k_proj.out_features == 16
    assert model.q_proj.fused.weight.shape == (96, 64)
    assert model.gate_proj.fused.weight.shape == (256, 64)
    assert model.k_proj.weight.shape == (16, 64) and model.q_proj.bias is None
    state = model.state_dict()
    assert state["k_proj.weight"].shape == (16, 64) and not any("fused" in k for k in state)


def test_a_call_the_trace_did_not_see_is_computed_not_served_stale():
    torch.manual_seed(0)
    model = BertStyleLayer()
    original = copy.deepcopy(model)
    _apply(model, (_x(),))
    x, y = _x(1), _x(2)
    with torch.no_grad():
        assert torch.equal(model.query(x), original.query(x))  # fused GEMM, round open
        torch.testing.assert_close(model.key(y), original.key(y))  # another tensor: own rows
        torch.testing.assert_close(model.key(x), original.key(x))  # served from the round
        x.add_(1.0)  # modified in place: the round's output is stale
        torch.testing.assert_close(model.value(x), original.value(x))
        torch.testing.assert_close(model.value(x), original.value(x))  # still its rows
    assert model.query.fused._round is not None
    copy.deepcopy(model)  # the open round is not copied
    model(x)
    torch.testing.assert_close(model(y), original(y))


class DataDependent(GQABlock):
    """Control flow on values: runs for real, not on the meta device."""

    def forward(self, x):
        return super().forward(x) if x.sum() > -1e9 else x


def test_meta_model_then_assign_load_and_a_data_dependent_model():
    with torch.device("meta"):
        model = GQABlock()
    assert len(_apply(model, (torch.empty(2, 16, 64, device="meta"),)).changes) == 2
    weights = GQABlock()
    model.load_state_dict(weights.state_dict(), strict=True, assign=True)
    assert model.gate_proj.fused.weight.device.type == "cpu"
    torch.testing.assert_close(model(_x(1)), weights(_x(1)), rtol=1e-5, atol=1e-5)
    model = DataDependent().train()
    assert len(_apply(model, (_x(),)).changes) == 2 and model.training and model.o_proj.training


# ---- refusals --------------------------------------------------------------------------------
class QuantLinear(nn.Linear):
    """Stands in for a quantized Linear: a subclass."""


class LoraLinear(nn.Module):
    """peft's shape: the wrapped Linear held as `base_layer`, the adapters beside it."""

    def __init__(self, base: nn.Linear, rank: int = 4):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.base_layer, self.lora_A = base, nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


def _refused(model: nn.Module, inputs: tuple, **options) -> dict[str, str]:
    before = [type(m) for m in model.modules()]
    outcome = _apply(model, inputs, **options)
    assert outcome.changes == [] and [type(m) for m in model.modules()] == before
    return {r.module: r.reason for r in outcome.refusals}


def test_cross_attention_is_refused():
    reasons = _refused(CrossAttention(), (_x(), _x(1, (2, 8, 64))))
    assert reasons == {"": "q and k/v read different inputs (cross-attention)"}


def test_hooked_shared_subclass_and_filtered_members_are_refused():
    hooked = BertStyleLayer()
    hooked.query.register_forward_hook(lambda m, i, o: None)
    assert "query has hooks" in _refused(hooked, (_x(),))[""]
    shared = BertStyleLayer()
    shared.value = shared.key
    assert "held at several places" in _refused(shared, (_x(),))[""]
    subclass = BertStyleLayer()
    subclass.key = QuantLinear(64, 64)
    assert "QuantLinear, not a plain nn.Linear" in _refused(subclass, (_x(),))[""]
    lora = BertStyleLayer()
    lora.value = LoraLinear(lora.value)
    assert "LoraLinear, not a plain nn.Linear" in _refused(lora, (_x(),))[""]
    filtered = BertStyleLayer()
    reasons = _refused(filtered, (_x(),), filter_fn=lambda m, fqn: fqn != "key")
    assert "filter_fn excludes key" in reasons[""]


def test_twice_equals_once_and_revert_is_exact():
    model = GQABlock()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modules = dict(model.named_modules())
    model, report = _optimize(model, (_x(),))
    assert len(report.applied) == 2
    again = _apply(model, (_x(),))
    assert again.changes == [] and again.refusals == []
    assert revert(model) is model and dict(model.named_modules()) == modules
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


# ---- Hugging Face models ---------------------------------------------------------------------
HF = {"bert": (tiny_bert, 2), "llama": (tiny_llama, 4)}


def _hf(name: str):
    pytest.importorskip("transformers")
    build, groups = HF[name]
    return build().eval(), groups


@pytest.fixture(scope="module", params=list(HF))
def hf(request):
    """(original copy, fused model, report) for each Hugging Face model."""
    model, groups = _hf(request.param)
    original = copy.deepcopy(model)
    fused, report = _optimize(model, (_ids(),))
    assert len(report.applied) == groups
    return original, fused, report


def test_hf_fused_verified_same_outputs_and_gradients(hf):
    original, model, report = hf
    assert report.verified["fuse-qkv"].passed and not report.rolled_back and not report.refused
    assert "separate-qkv" in _rules(report.before) and "separate-qkv" not in _rules(report.after)
    model, original = copy.deepcopy(model), copy.deepcopy(original)
    ids = _ids(1)
    torch.testing.assert_close(_first(model(ids)), _first(original(ids)), rtol=1e-5, atol=1e-5)
    for m in (model, original):
        _loss(m, (ids,)).backward()
    grads = original_gradients(model)
    for name, p in original.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_hf_state_dict_original_keys_strict_load_and_round_trip(hf, tmp_path):
    original, model, _ = hf
    model = copy.deepcopy(model)
    assert _shapes(model.state_dict()) == _shapes(original.state_dict())
    trained = copy.deepcopy(original)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.load_state_dict(trained.state_dict(), strict=True)
    ids = _ids(2)
    with torch.no_grad():
        torch.testing.assert_close(_first(model(ids)), _first(trained(ids)), rtol=1e-5, atol=1e-5)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    fresh = copy.deepcopy(original)
    fresh.load_state_dict(saved, strict=True)
    copy.deepcopy(model).load_state_dict(saved, strict=True)
    model.save_pretrained(tmp_path)
    reloaded = type(original).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        for m in (fresh, reloaded):
            torch.testing.assert_close(_first(m(ids)), _first(model(ids)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(HF))
def test_hf_twice_once_and_revert(name):
    model, _ = _hf(name)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    types = [(k, type(m)) for k, m in model.named_modules()]
    model, _ = _optimize(model, (_ids(),))
    again = _apply(model, (_ids(),))
    assert again.changes == [] and again.refusals == []
    model = revert(model)
    assert [(k, type(m)) for k, m in model.named_modules()] == types
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", list(HF))
def test_hf_training_then_revert_keeps_what_was_learned(name):
    model, _ = _hf(name)
    plain = copy.deepcopy(model)
    model, _ = _optimize(model, (_ids(),))
    for m in (model, plain):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            opt.zero_grad()
            _loss(m, (_ids(10 + step),)).backward()
            opt.step()
    model = revert(model)
    assert not any(isinstance(m, (FusedLinear, FusedSlice)) for m in model.modules())
    trained = plain.state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, trained[key], rtol=1e-5, atol=1e-5, msg=key)
