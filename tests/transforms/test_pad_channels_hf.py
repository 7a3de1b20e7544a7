"""pad-channels on Hugging Face's masked-LM head: the decoder's bias is also the head's own
`bias` Parameter (tied); both are padded as one, the state_dict keeps the vocabulary's rows."""

from __future__ import annotations

import copy

import pytest
import torch

from gpushape.transforms import optimize, revert

transformers = pytest.importorskip("transformers")

VOCAB = 1001  # not a multiple of 8


def _bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(config).eval()


def test_bert_decoder_and_its_tied_bias_padded_checked_and_reverted(tmp_path):
    model = _bert()
    original = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2, 16))
    model, report = optimize(
        model, (ids,), gpu="h200", dtype=torch.float32, transforms=["pad-channels"]
    )
    assert not report.refused and report.verified["pad-channels"].passed
    head = model.cls.predictions
    assert head.decoder.weight.shape[0] == 1008 and head.decoder.bias is head.bias
    assert head.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert {c.module for c in report.applied} >= {"cls.predictions.decoder", "cls.predictions"}
    sd, ref = model.state_dict(), original.state_dict()
    assert {k: v.shape for k, v in sd.items()} == {k: v.shape for k, v in ref.items()}
    model.load_state_dict(ref, strict=True)
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.full_like(ids, -100))
    with torch.no_grad():
        out, want = model(ids, labels=labels), original(ids, labels=labels)
    assert out.logits.shape == want.logits.shape
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=1e-5)
    # a step of training moves the tied bias; revert keeps what was learned, in the old shape
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(ids, labels=labels).loss.backward()
    opt.step()
    trained = head.bias.detach()[:VOCAB].clone()
    model = revert(model)
    head = model.cls.predictions
    assert head.bias.shape == (VOCAB,) and head.decoder.bias is head.bias
    torch.testing.assert_close(head.bias.detach(), trained)
    assert type(head.decoder) is torch.nn.Linear
