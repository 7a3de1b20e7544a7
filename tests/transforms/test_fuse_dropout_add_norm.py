"""fuse-dropout-add-norm: which modules match (statement for statement), the same function with
dropout off (output and every gradient), dropout still applied in training, undo, copies and
pickles, hooks refused, autocast left to the class's forward, and Hugging Face BERT and RoBERTa
through optimize()'s numeric gate."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import gpushape
from gpushape.transforms import TransformContext, get_transform, revert
from gpushape.transforms.fuse_dropout_add_norm import ID, matches_pattern


class SelfOutput(nn.Module):
    """BertSelfOutput, as transformers writes it."""

    def __init__(self, width=24, p=0.1):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.LayerNorm = nn.LayerNorm(width, eps=1e-12)
        self.dropout = nn.Dropout(p)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class ReturnsDirectly(SelfOutput):
    def forward(self, h, residual):
        """A docstring is not a statement."""
        h = self.dense(h)
        h = self.dropout(h)
        return self.LayerNorm(residual + h)


class NormThenDropout(SelfOutput):
    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class ScaledResidual(SelfOutput):
    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + 0.5 * input_tensor)
        return hidden_states


class ExtraChild(SelfOutput):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU()


class Block(nn.Module):
    def __init__(self, out: nn.Module):
        super().__init__()
        self.inner = nn.Linear(24, 24)
        self.out = out

    def forward(self, x):
        return self.out(self.inner(x), x)


def _apply(model):
    return get_transform(ID).apply(model, TransformContext(example_inputs=(), train=True))


def _grads(model, x):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    y = model(x)
    y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
    return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, x.grad


@pytest.mark.parametrize("cls", [SelfOutput, ReturnsDirectly])
def test_the_pattern_matches(cls):
    assert matches_pattern(cls()) is None


@pytest.mark.parametrize(
    ("cls", "says"),
    [
        (NormThenDropout, "not dense, dropout, then LayerNorm"),
        (ScaledResidual, "not dense, dropout, then LayerNorm"),
        (ExtraChild, "not the children"),
    ],
)
def test_other_modules_do_not_match(cls, says):
    assert says in matches_pattern(cls())
    model = Block(cls())
    assert not _apply(model).changes and "forward" not in model.out.__dict__


def test_same_function_with_dropout_off(interpret):
    torch.manual_seed(0)
    model = Block(SelfOutput(p=0.0)).train()
    x = torch.randn(2, 5, 24)
    ref = _grads(copy.deepcopy(model), x)
    outcome = _apply(model)
    assert [c.module for c in outcome.changes] == ["out"]
    got = _grads(model, x)
    torch.testing.assert_close(got[0], ref[0])
    for name in ref[1]:
        torch.testing.assert_close(got[1][name], ref[1][name], msg=name)
    torch.testing.assert_close(got[2], ref[2])


def test_dropout_still_applies_in_training_and_not_in_eval(interpret):
    torch.manual_seed(0)
    model = Block(SelfOutput(p=0.5))
    x = torch.randn(4, 24)
    _apply(model)
    model.eval()
    expected = model.out.LayerNorm(model.out.dense(model.inner(x)) + x)
    torch.testing.assert_close(model(x), expected)
    model.train()
    seen = []
    model.out.dense.register_forward_hook(lambda m, i, o: seen.append(o) or o.retain_grad())
    y = model(x)
    y.backward(torch.randn_like(y))
    dropped = (seen[0].grad == 0).float().mean().item()
    assert 0.3 < dropped < 0.7  # p = 0.5 of 96 projected features


def test_undo_state_dict_copy_and_pickle(interpret):
    model = Block(SelfOutput())
    keys = list(model.state_dict())
    _apply(model)
    assert list(model.state_dict()) == keys
    clone = copy.deepcopy(model)
    assert "forward" in clone.out.__dict__ and clone.out.__dict__["forward"].model is clone.out
    buffer = io.BytesIO()
    pickle.dump(model, buffer)
    assert "forward" in pickle.loads(buffer.getvalue()).out.__dict__
    again = _apply(model)
    assert not again.changes  # applying twice equals once
    for change in _apply(Block(SelfOutput())).changes:
        change.undo()
    model2 = Block(SelfOutput())
    outcome = _apply(model2)
    outcome.changes[0].undo()
    assert "forward" not in model2.out.__dict__


def test_hooks_are_refused():
    model = Block(SelfOutput())
    model.out.register_forward_hook(lambda m, i, o: None)
    outcome = _apply(model)
    assert not outcome.changes and "hooks" in outcome.refusals[0].reason


def test_autocast_runs_the_class_forward(interpret):
    torch.manual_seed(0)
    model = Block(SelfOutput(p=0.0))
    ref = copy.deepcopy(model)
    _apply(model)
    x = torch.randn(3, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = model(x), ref(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)


transformers_needed = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("transformers"), reason="needs transformers"
)


@transformers_needed
@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_hugging_face_blocks_pass_optimize(interpret, kind):
    from gpushape.models.library import hf_model

    tiny = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
    model, _ = hf_model(kind, device="cpu", dtype=torch.float32, vocab_size=101, **tiny)
    torch.manual_seed(0)
    for p in model.parameters():
        p.data = torch.randn_like(p) * 0.05
    ids = torch.randint(0, 101, (2, 8), generator=torch.Generator().manual_seed(1))
    model, report = gpushape.optimize(model, (ids,), gpu="h200", dtype=torch.float32,
                                      train=True, transforms=[ID])  # fmt: skip
    changed = sorted(c.module for c in report.applied)
    assert len(changed) == 4 and all(m.endswith(("attention.output", "output")) for m in changed)
    assert all(v.passed for v in report.verified.values())
    model.train()
    model(ids).logits.sum().backward()  # dropout on: the kernels' training path runs
    revert(model)
    assert not any("forward" in m.__dict__ for m in model.modules() if m is not model)


def test_torch_compile_traces_the_fused_block_whole(interpret):
    """fullgraph: the instance forward, the seed draw and the custom op trace without a break
    (the BERT case compiles it); with dropout off the compiled block equals the eager one."""
    torch.manual_seed(0)
    model = Block(SelfOutput(p=0.0)).train()
    _apply(model)
    x = torch.randn(4, 24)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x))
    model.out.dropout.p = 0.3
    y = torch.compile(model, fullgraph=True, backend="aot_eager")(x.requires_grad_())
    y.backward(torch.randn_like(y))
    assert x.grad is not None and torch.isfinite(x.grad).all()
