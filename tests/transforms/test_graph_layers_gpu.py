"""graph-layers on the GPU, on a tiny Hugging Face BERT with its dropout on: the graphed model's
outputs and every gradient equal the eager model's from the same seed, over several training
steps (AdamW, gradients set to None and zeroed in place, and accumulated over two
micro-batches); eval mode and other shapes run eagerly; state_dict, revert, twice equals once;
optimize keeps it only on a timing. Run on the GPU machine: pytest -m gpu."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gpushape.models.library import hf_model  # noqa: E402
from gpushape.transforms import graph_layers, optimize, revert  # noqa: E402
from gpushape.transforms._core import TransformContext  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TINY = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=128)


def _bert(batch: int = 4, seq: int = 32):
    torch.backends.cuda.matmul.allow_tf32 = False
    model, _ = hf_model("bert", device="cuda", dtype=torch.float32, vocab_size=512, **TINY)
    torch.manual_seed(0)
    for p in model.parameters():  # hf_model builds on meta: give it values
        p.data = torch.randn_like(p) * 0.05
    ids = torch.randint(0, 512, (batch, seq), device="cuda")
    return model.train(), ids


def _graphed(model, ids):
    out = graph_layers.apply(model, TransformContext(example_inputs=(ids,)))
    assert [c.module for c in out.changes] == [f"bert.encoder.layer.{i}" for i in range(3)], (
        out.refusals
    )
    return out


def _loss(model, ids, seed):
    torch.cuda.manual_seed(seed)
    logits = model(ids).logits
    return (logits.float() * torch.linspace(-1, 1, logits.shape[-1], device="cuda")).mean()


def _assert_same(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
        if q.grad is None:
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("zeroing", ["none", "in-place", "accumulate"])
def test_training_steps_equal_eager(zeroing):
    model, ids = _bert()
    ref = copy.deepcopy(model)
    _graphed(model, ids)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    for step in range(3):
        for m, opt in zip((model, ref), opts):
            opt.zero_grad(set_to_none=zeroing == "none")
            _loss(m, ids, seed=step).backward()
            if zeroing == "accumulate":  # a second micro-batch adds to the gradients
                _loss(m, ids.flip(0), seed=100 + step).backward()
        _assert_same(model, ref)
        for opt in opts:
            opt.step()
    _assert_same(model, ref)


def test_other_calls_run_eagerly_and_state_dict_revert():
    model, ids = _bert()
    ref = copy.deepcopy(model)
    first = _graphed(model, ids)
    assert not graph_layers.apply(model, TransformContext(example_inputs=(ids,))).changes
    model.eval(), ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits)
    model.train(), ref.train()
    short = ids[:, :16]
    torch.testing.assert_close(_loss(model, short, 7), _loss(ref, short, 7))
    assert list(model.state_dict()) == list(ref.state_dict())
    ref.load_state_dict(model.state_dict(), strict=True)
    from gpushape.transforms._core import undo

    undo(first.changes)
    assert not any(graph_layers.is_graphed(layer) for layer in model.bert.encoder.layer)


def test_optimize_keeps_it_only_on_a_timing():
    model, ids = _bert()
    model, report = optimize(model, (ids,), train=True)
    kept = any(c.transform == "graph-layers" for c in report.applied)
    why = [r.reason for r in report.refused + report.rolled_back if r.transform == "graph-layers"]
    if kept:  # a tiny model is host-bound: the graphs pay
        eager_s, graphed_s = report.measured["graph-layers"]
        assert graphed_s <= eager_s * graph_layers.FASTER
        revert(model)
        assert not any(graph_layers.is_graphed(layer) for layer in model.bert.encoder.layer)
    else:
        assert any("not 3% faster" in r for r in why), why
