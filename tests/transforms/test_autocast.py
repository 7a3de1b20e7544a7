"""autocast-bf16: the forward under torch.autocast with float32 parameters, checked against
float64 at bf16's level; state_dict, deep copies and pickles unchanged; reversible, idempotent,
scoped by filter_fn; refusals with reasons; the audit sees it where it covers the whole model."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import fx, nn

import gpushape
from _chips import H100_DATASHEET
from gpushape.transforms import optimize, revert, verify
from gpushape.transforms._verify import compute_dtype, lower_reference, reference
from gpushape.transforms.activation_checkpoint import saved_bytes
from gpushape.transforms.autocast import AutocastForward, autocast_model, wrapped

from .nets import BertStyleLayer, ConvNet, GQABlock, MLPBlock

ID = "autocast-bf16"
CASES = {
    "mlp": (MLPBlock, (2, 4, 32)),
    "conv": (ConvNet, (4, 3, 8, 8)),
    "bert-layer": (BertStyleLayer, (2, 8, 64)),
    "gqa-block": (GQABlock, (2, 8, 64)),
}


def _case(name: str):
    make, shape = CASES[name]
    torch.manual_seed(0)
    return make(), torch.randn(*shape)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _grads(model: nn.Module, x: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out * g).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _optimized(name: str, **kwargs):
    model, x = _case(name)
    original = copy.deepcopy(model)
    model, report = optimize(model, (x,), dtype=torch.float32, transforms=[ID], **kwargs)
    return original, model, x, report


@pytest.mark.parametrize("name", CASES)
def test_bf16_math_float32_weights_within_bf16_of_float32(name):
    original, model, x, report = _optimized(name)
    assert report.verified[ID].passed, report.verified[ID].worst
    assert [c.module for c in report.applied] == [""] and not report.refused
    assert all(p.dtype == torch.float32 for p in model.parameters())
    inner = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d)))
    seen = []
    handle = inner.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    out, grads = _grads(model, x)
    handle.remove()
    assert seen == [torch.bfloat16] and out.dtype == torch.float32  # bf16 inside, fp32 out
    assert all(g.dtype == torch.float32 for g in grads.values())
    ref_out, ref_grads = _grads(original, x)
    _, cast_grads = _grads(copy.deepcopy(original).bfloat16(), x.bfloat16())
    assert _rel(out, ref_out) < 2e-2
    # all gradients as one vector, within bf16's reach: 3e-2, or as far as the model cast to
    # bf16 lands (ConvNet's mean-pooled BatchNorm gradients cancel: ~15% either way)
    flat, ref_flat, cast_flat = (torch.cat([g[n].flatten() for n in grads]).float()
                                 for g in (grads, ref_grads, cast_grads))  # fmt: skip
    assert _rel(flat, ref_flat) <= max(3e-2, 1.5 * _rel(cast_flat, ref_flat))


def test_the_gate_takes_bf16s_level_from_pytorchs_own_bf16_run():
    """ConvNet's BatchNorm gradients land ~20-30% from float64 under bf16 autocast: a fixed
    bf16 tolerance would roll it back; the original cast to bf16 lands as far, and that is
    the bound's scale. A wrong model under the same autocast still fails."""
    model, x = _case("conv")
    ref = reference(model, (x,))
    lower = lower_reference(model, (x,), torch.bfloat16)
    ours = copy.deepcopy(model)
    autocast_model(ours)
    assert compute_dtype(ours) == torch.bfloat16 and compute_dtype(model) is None
    assert not verify(ours, (x,), ref).passed  # bf16's fixed tolerance alone
    assert verify(ours, (x,), ref, lower).passed
    ours.blocks[0].relu = nn.Identity()  # activations lost
    assert not verify(ours, (x,), ref, lower).passed
    plain = copy.deepcopy(model)
    plain.head.bias.data.add_(0.05)  # an output shifted by a twentieth, no autocast
    assert not verify(plain, (x,), ref, lower).passed


def test_state_dict_deepcopy_and_pickle_unchanged():
    original, model, x, _ = _optimized("mlp")
    assert list(model.state_dict()) == list(original.state_dict())
    fresh = MLPBlock()
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(fresh(x), original(x))
    model.load_state_dict(original.state_dict(), strict=True)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (loaded, copy.deepcopy(model)):
        assert wrapped(other).module is other  # wraps its own copy, not the original
        assert torch.equal(other(x), model(x))


def test_revert_restores_the_original_forward_bit_exact():
    original, model, x, _ = _optimized("bert-layer")
    assert not torch.equal(model(x), original(x))
    model = revert(model)
    assert "forward" not in model.__dict__
    assert torch.equal(model(x), original(x))


def test_twice_equals_once():
    model, x = _case("mlp")
    model, first = optimize(model, (x,), dtype=torch.float32, transforms=[ID])
    once = model.forward
    model, second = optimize(model, (x,), dtype=torch.float32, transforms=[ID])
    assert first.applied and not second.applied and not second.refused
    assert model.forward is once and once.inner is None


def test_filter_fn_wraps_the_outermost_modules_it_allows():
    model, x = _case("conv")
    model, report = optimize(
        model,
        (x,),
        dtype=torch.float32,
        transforms=[ID],
        filter_fn=lambda m, fqn: fqn.startswith("blocks"),
    )
    assert [c.module for c in report.applied] == ["blocks"]
    assert report.verified[ID].passed
    seen = {}
    for name in ("blocks.0.conv1", "head"):
        model.get_submodule(name).register_forward_hook(
            lambda m, a, out, name=name: seen.update({name: out.dtype})
        )
    model(x)
    assert seen == {"blocks.0.conv1": torch.bfloat16, "head": torch.float32}
    # the audit cannot see autocast on part of the model: fp32-math still fires (conservative)
    assert any(f.rule == "fp32-math" for f in report.after.findings)


def test_an_already_half_precision_model_is_refused_with_the_reason():
    model, x = _case("mlp")
    model = model.bfloat16()
    model, report = optimize(model, (x.bfloat16(),), dtype=torch.bfloat16, transforms=[ID])
    assert not report.applied and "forward" not in model.__dict__
    assert "already" in report.refused[0].reason and "bfloat16" in report.refused[0].reason


class Decorated(MLPBlock):
    @torch.autocast("cpu", dtype=torch.bfloat16)
    def forward(self, x):
        return super().forward(x)


def test_a_forward_already_under_autocast_is_refused():
    model, x = Decorated(), torch.randn(2, 4, 32)
    _, report = optimize(model, (x,), dtype=torch.float32, transforms=[ID])
    assert not report.applied and "torch.autocast" in report.refused[0].reason


def test_hooks_inside_are_refused_hooks_on_the_root_kept():
    model, x = _case("mlp")
    model.fc.register_forward_hook(lambda m, a, out: None)
    _, report = optimize(model, (x,), dtype=torch.float32, transforms=[ID])
    assert not report.applied and "a hook on fc" in report.refused[0].reason
    model, x = _case("mlp")
    seen = []
    model.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    model, report = optimize(model, (x,), dtype=torch.float32, transforms=[ID])
    seen.clear()
    model(x)
    assert report.applied and seen == [torch.float32]


def test_a_forward_replaced_on_the_instance_runs_inside_and_comes_back_on_revert():
    model, x = _case("mlp")
    calls = []

    class Counting:  # another tool's wrapper (a bound method of another object would do)
        def __init__(self, m):
            self.m = m

        def __call__(self, *args):
            calls.append(torch.is_autocast_enabled("cpu"))
            return type(self.m).forward(self.m, *args)

    theirs = model.forward = Counting(model)
    model, report = optimize(model, (x,), dtype=torch.float32, transforms=[ID])
    calls.clear()
    model(x)
    assert report.applied and calls == [True]
    assert revert(model).forward is theirs


def test_fp16_chip_training_refused_inference_applied_explicit_allowed():
    model, x = _case("mlp")
    _, report = optimize(
        model, (x,), gpu="v100-sxm2", train=True, dtype=torch.float32, transforms=[ID]
    )
    assert not report.applied and "GradScaler" in report.refused[0].reason
    model, report = optimize(
        model, (x,), gpu="v100-sxm2", train=False, dtype=torch.float32, transforms=[ID]
    )
    assert report.verified[ID].passed and "fp16" in report.applied[0].detail
    assert wrapped(model).autocast_dtype == torch.float16
    model, x = _case("mlp")
    out = autocast_model(model, torch.float16)
    assert "GradScaler" in out.changes[0].detail
    assert revert(model) is model and "forward" not in model.__dict__


def test_audit_raises_fp32_math_before_and_not_after():
    model, x = _case("conv")
    x = torch.randn(8, 3, 32, 32)
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=[ID])
    assert any(f.rule == "fp32-math" for f in report.before.findings)
    assert not any(f.rule == "fp32-math" for f in report.after.findings)
    assert report.after.dtype == "bf16"
    # the GPU's work shrinks; the wall clock of this tiny step is the host's and does not move
    assert report.after.step.gpu_s < report.before.step.gpu_s
    assert report.step_after_s <= report.step_before_s
    # a plain audit traces on meta, where autocast does nothing: it still prices fp32
    plain = gpushape.audit(model, (x,), gpu="h200", dtype=torch.float32)
    assert any(f.rule == "fp32-math" for f in plain.findings)


def test_picked_from_the_findings_and_applied_last_over_the_other_fixes():
    """The root fuse-norm-act rewrote into a GraphModule is wrapped; its deep copies (which
    torch.fx rebuilds from the graph) keep the wrapper."""
    model, x = _case("conv")
    # the H100 datasheet: no measured host rates, so the tiny batch is not host-bound
    model, report = optimize(model, (x,), gpu=H100_DATASHEET, dtype=torch.float32)
    done = [c.transform for c in report.applied]
    assert done[-1] == ID and "fuse-norm-act" in done and not report.rolled_back
    assert report.verified[ID].passed
    assert isinstance(model, fx.GraphModule) and isinstance(wrapped(model), AutocastForward)
    twin = copy.deepcopy(model)
    assert wrapped(twin).module is twin and torch.equal(twin(x), model(x))
    original = revert(model)
    assert not any("forward" in m.__dict__ for m in original.modules())


def test_a_wrapped_parent_is_refused_by_fuse_norm_act_not_unwrapped():
    model, x = _case("conv")
    autocast_model(model)
    model, report = optimize(model, (x,), dtype=torch.float32, transforms=["fuse-norm-act"])
    assert [r.module for r in report.refused] == [""] and "replaced" in report.refused[0].reason
    assert isinstance(wrapped(model), AutocastForward) and report.applied  # the blocks fused


def test_activation_checkpoint_plans_under_autocast():
    torch.manual_seed(0)
    model, x = nn.Sequential(*(MLPBlock(32) for _ in range(4))), torch.randn(4, 64, 32)
    mixed = copy.deepcopy(model)
    autocast_model(mixed)
    budget = saved_bytes(mixed, (x,)) // 2
    model, report = optimize(
        model, (x,), gpu="h200", dtype=torch.float32, memory_budget=budget, transforms=[ID]
    )
    assert {c.transform for c in report.applied} == {ID, "activation-checkpoint"}
    assert isinstance(wrapped(model), AutocastForward)
    assert saved_bytes(model, (x,)) <= budget


def test_wrapped_layers_are_left_to_their_wrapper_by_pad_channels_and_fuse_qkv():
    model, x = _case("bert-layer")
    autocast_model(model, filter_fn=lambda m, fqn: isinstance(m, nn.Linear))
    model, report = optimize(
        model, (x,), gpu="h200", dtype=torch.float32, transforms=["pad-channels", "fuse-qkv"]
    )
    assert not report.applied
    assert all(isinstance(wrapped(m), AutocastForward) for m in model.modules()
               if isinstance(m, nn.Linear))  # fmt: skip


def test_trains_like_the_float32_model():
    """A few dozen SGD steps from one seed track the float32 loss curve."""
    torch.manual_seed(0)
    data = [(torch.randn(16, 32), torch.randint(0, 32, (16,))) for _ in range(4)]
    losses = {}
    for mixed in (False, True):
        model, _ = _case("mlp")
        if mixed:
            autocast_model(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        curve = []
        for step in range(40):
            x, y = data[step % len(data)]
            loss = nn.functional.cross_entropy(model(x.unsqueeze(1)).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[mixed] = torch.tensor(curve)
    assert losses[True][-1] < 0.25 * losses[True][0]
    assert torch.allclose(losses[True], losses[False], rtol=3e-2, atol=1e-2)


def test_torch_compile_keeps_autocast_in_one_graph():
    model, x = _case("mlp")
    autocast_model(model)
    eager = model(x)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    assert out.dtype == torch.float32 and torch.allclose(out, eager, atol=1e-6)
    assert gpushape.transforms.get_transform(ID).pays_under_compile


def test_hugging_face_logits_come_back_float32():
    pytest.importorskip("transformers")
    from .nets import tiny_gpt2

    model = tiny_gpt2().eval()  # dropout off: the two runs below draw no masks
    ids = torch.randint(0, 128, (2, 16))
    original = copy.deepcopy(model)
    model, report = optimize(model, (ids,), dtype=torch.float32, transforms=[ID])
    assert report.verified[ID].passed, report.verified[ID].worst
    out = model(ids)
    assert type(out) is type(original(ids)) and out.logits.dtype == torch.float32
    fresh = tiny_gpt2()
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert _rel(out.logits.detach(), original(ids).logits.detach()) < 2e-2


def test_a_masked_lm_head_runs_inside_autocast():
    """masked-lm-head's forward (on the instance) is wrapped, not dropped: the loss and the
    labelled rows' logits come back float32; revert undoes both."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model, ids = transformers.BertForMaskedLM(config), torch.randint(0, 128, (2, 16))
    model, report = optimize(model, (ids,), dtype=torch.float32, transforms=["masked-lm-head", ID])
    assert [c.transform for c in report.applied] == ["masked-lm-head", ID]
    assert wrapped(model).inner is not None and report.verified[ID].passed
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]
    out = model(ids, labels=labels)
    assert out.loss.dtype == out.logits.dtype == torch.float32 and out.logits.shape[0] == 8
    assert "forward" not in revert(model).__dict__
