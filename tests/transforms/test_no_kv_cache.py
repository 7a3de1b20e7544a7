"""no-kv-cache on Hugging Face decoders (tiny GPT-2 and LLaMA, CPU, fp32, no dropout): a
training forward builds no cache, the loss and every gradient equal the original's; evaluation
keeps the cache; a caller's own use_cache, positions or padding mask are obeyed; dynamo's graph
has no cache copies and SDPA no mask; revert, idempotence, deep copy, state_dict and config;
the audit after is quiet; refusals."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import gpushape  # noqa: E402
from gpushape.models.hf_masks import trains_without_cache  # noqa: E402
from gpushape.models.library import hf_model  # noqa: E402
from gpushape.transforms import revert  # noqa: E402

GPT2 = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
LLAMA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128, max_position_embeddings=64)  # fmt: skip


def _decoder(kind: str):
    model, _ = hf_model(
        kind, device="cpu", dtype=torch.float32, **(GPT2 if kind == "gpt2" else LLAMA)
    )
    torch.manual_seed(0)
    for p in model.parameters():  # hf_model builds on meta: give it values
        p.data = torch.randn_like(p) * 0.05
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model.train(), ids


def _step(model, ids, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, **kwargs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _apply(model, ids):
    return gpushape.optimize(
        model, (ids,), gpu="h200", dtype=torch.float32, transforms=["no-kv-cache"]
    )


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_training_forwards_drop_the_cache_with_the_same_loss_and_gradients(kind):
    model, ids = _decoder(kind)
    ref, ref_grads = _step(copy.deepcopy(model), ids)
    assert ref.past_key_values is not None  # transformers' default: the cache is built
    model, report = _apply(model, ids)
    assert [c.transform for c in report.applied] == ["no-kv-cache"], report.refused
    out, grads = _step(model, ids)
    assert out.past_key_values is None
    torch.testing.assert_close(out.loss, ref.loss)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], msg=name)
    assert _step(model, ids, use_cache=True)[0].past_key_values is not None  # the caller's say
    with torch.no_grad():
        assert model.eval()(ids).past_key_values is not None  # evaluation keeps it


def test_a_padding_mask_or_positions_given_are_obeyed():
    model, ids = _decoder("gpt2")
    padding = torch.ones_like(ids)
    padding[0, -4:] = 0
    with torch.no_grad():
        expected = model(ids, attention_mask=padding).logits
    model, _ = _apply(model, ids)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=padding).logits, expected)


def test_dynamo_graph_has_no_cache_copy_and_no_mask():
    model, ids = _decoder("gpt2")
    model, _ = _apply(model, ids)
    seen = {"cat": 0, "masks": []}

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.target is torch.cat:
                seen["cat"] += 1
            if node.target is F.scaled_dot_product_attention:
                seen["masks"].append(node.kwargs.get("attn_mask") is not None)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(ids, labels=ids)
    torch._dynamo.reset()
    assert seen["cat"] == 0 and seen["masks"] and not any(seen["masks"])


def test_revert_twice_copy_state_dict_and_config():
    model, ids = _decoder("gpt2")
    state = copy.deepcopy(model.state_dict())
    model, _ = _apply(model, ids)
    assert trains_without_cache(model) and model.config.use_cache is True
    again = _apply(model, ids)[1]
    assert again.applied == [] and again.refused == []  # twice equals once
    twin = copy.deepcopy(model)  # the copy runs its own parameters
    assert trains_without_cache(twin)
    unpickled = pickle.loads(pickle.dumps(model))
    assert trains_without_cache(unpickled) and unpickled.forward.model is unpickled
    _, grads = _step(twin, ids)
    assert grads and all(p.grad is None for p in model.parameters())
    revert(model)
    assert not trains_without_cache(model) and "forward" not in model.__dict__
    assert _step(model, ids)[0].past_key_values is not None
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_the_audit_after_is_quiet_and_not_applied_in_inference_or_to_encoders():
    model, ids = _decoder("gpt2")
    rules = ["kv-cache-in-training"]
    before = gpushape.audit(model, (ids,), gpu="h200", train=True, rules=rules)
    assert [f.fix for f in before.findings] == ["no-kv-cache"]
    model, _ = _apply(model, ids)
    assert gpushape.audit(model, (ids,), gpu="h200", train=True, rules=rules).findings == []
    fresh, _ = _decoder("gpt2")
    _, report = gpushape.optimize(
        fresh, (ids,), gpu="h200", train=False, dtype=torch.float32, transforms=["no-kv-cache"]
    )
    assert report.applied == []
    bert, _ = hf_model("bert", device="cpu", dtype=torch.float32, num_hidden_layers=1,
                       hidden_size=64, num_attention_heads=2, intermediate_size=128)  # fmt: skip
    assert gpushape.optimize(bert, (ids,), gpu="h200", transforms=["no-kv-cache"])[1].applied == []
