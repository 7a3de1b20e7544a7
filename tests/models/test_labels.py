"""The labels a library model's own loss reads in the audit's trace: causal LMs their ids,
masked LMs a fixed 1-in-7 pattern, classifiers a class; other models and models already given
labels traced as given."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.models.heads import IGNORE_INDEX, capacity_rows
from gpushape.models.labels import MASK_EVERY, label_task, labels_for, with_labels
from gpushape.models.library import hf_model

pytest.importorskip("transformers")

TINY_GPT2 = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=97)
TINY_BERT = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                 intermediate_size=64, vocab_size=97)  # fmt: skip


def test_each_task_gets_the_labels_its_loss_reads():
    gpt2, (ids,) = hf_model("gpt2", batch=2, seq=14, device="meta", **TINY_GPT2)
    bert, _ = hf_model("bert", batch=2, seq=14, device="meta", **TINY_BERT)
    assert label_task(gpt2, ids) == "causal" and label_task(bert, ids) == "masked"
    causal = with_labels(gpt2, (ids,))
    assert set(causal) >= {"input_ids", "labels"} and causal["labels"] is ids
    masked = labels_for("masked", torch.arange(28).view(2, 14))
    kept = masked != IGNORE_INDEX
    assert kept.view(-1).nonzero().view(-1).tolist() == list(range(0, 28, MASK_EVERY))
    assert int(kept.sum()) <= capacity_rows(28)  # within masked-lm-head's fixed rows
    assert torch.equal(masked[kept], torch.arange(28).view(2, 14)[kept])
    assert labels_for("classes", torch.zeros(3, 5)).tolist() == [0, 0, 0]


def test_models_without_a_loss_or_already_given_labels_are_traced_as_given():
    plain = nn.Linear(4, 4)
    x = torch.zeros(2, 4)
    assert label_task(plain, x) is None and with_labels(plain, (x,)) == (x,)
    gpt2, (ids,) = hf_model("gpt2", batch=2, seq=8, device="meta", **TINY_GPT2)
    given = {"input_ids": ids, "labels": ids}
    assert with_labels(gpt2, given) is given
    bert, _ = hf_model("bert", batch=2, seq=8, device="meta", **TINY_BERT)
    floats = torch.zeros(2, 8, device="meta")  # not token ids: no LM labels
    assert label_task(bert, floats) is None


def test_a_forward_replaced_on_the_instance_still_gets_labels():
    """masked-lm-head puts a `*args, **kwargs` forward on the instance: the class's forward
    says what the model takes."""
    bert, (ids,) = hf_model("bert", batch=2, seq=8, device="meta", **TINY_BERT)
    bert.forward = lambda *a, **k: None
    assert set(with_labels(bert, (ids,))) >= {"input_ids", "labels"}
