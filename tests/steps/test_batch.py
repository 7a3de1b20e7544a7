"""The synthetic batch: realistic values, labels for each task, a loss that trains."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.steps import build_step, synthetic_batch
from gpushape.steps.batch import IGNORE, vocabulary
from transforms.nets import ConvNet


def test_images_get_noise_and_classes_cross_entropy():
    model = ConvNet()
    x = torch.zeros(4, 3, 16, 16)
    batch = synthetic_batch(model, (x,))
    assert batch.samples == 4 and batch.tokens == 0
    assert batch.inputs[0].std() > 0.5  # noise, not the zeros given
    loss = batch.loss(model(*batch.inputs))
    assert loss.dim() == 0 and loss.item() > 0
    # the labels are drawn once: the same loss twice for the same logits
    assert batch.loss(model(*batch.inputs)).item() == pytest.approx(loss.item())


def test_channels_last_inputs_keep_their_layout():
    x = torch.zeros(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    batch = synthetic_batch(ConvNet(), (x,))
    assert batch.inputs[0].is_contiguous(memory_format=torch.channels_last)


def test_token_ids_spread_over_the_vocabulary_of_a_plain_model():
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    batch = synthetic_batch(model, (torch.zeros(2, 32, dtype=torch.long),))
    ids = batch.inputs[0]
    assert ids.dtype == torch.long and ids.max() < 50 and ids.unique().numel() > 10
    assert batch.tokens == 64 and vocabulary(model) == 50
    loss = batch.loss(model(ids))  # a language model's logits against the input ids
    assert loss.item() == pytest.approx(torch.log(torch.tensor(50.0)).item(), rel=0.3)


def test_hugging_face_causal_and_masked_lm_labels():
    transformers = pytest.importorskip("transformers")
    from transforms.nets import tiny_gpt2

    gpt2 = tiny_gpt2()
    batch = synthetic_batch(gpt2, (torch.zeros(2, 16, dtype=torch.long),))
    assert torch.equal(batch.kwargs["labels"], batch.inputs[0])
    assert batch.loss(gpt2(*batch.inputs, **batch.kwargs)).dim() == 0
    cfg = transformers.BertConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64,
    )  # fmt: skip
    bert = transformers.BertForMaskedLM(cfg)
    batch = synthetic_batch(bert, (torch.zeros(4, 64, dtype=torch.long),))
    labels = batch.kwargs["labels"]
    masked = labels != IGNORE
    assert 0.05 < masked.float().mean().item() < 0.3  # about 15%
    assert (batch.inputs[0][masked] == 103).all()  # BERT's [MASK] id
    assert "masked LM" in batch.task


def test_a_sequence_classifier_on_token_ids_gets_a_class_per_sample():
    """Token ids do not make a causal LM: BertForSequenceClassification's loss reads one class
    per sample, and a token classifier's labels are not guessed (its logits take the plain
    cross-entropy)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, num_labels=3,
    )  # fmt: skip
    ids = (torch.zeros(4, 16, dtype=torch.long),)
    model = transformers.BertForSequenceClassification(cfg)
    batch = synthetic_batch(model, ids)
    labels = batch.kwargs["labels"]
    assert labels.shape == (4,) and int(labels.max()) < 3 and "classification" in batch.task
    assert batch.loss(model(*batch.inputs, **batch.kwargs)).dim() == 0
    tokens = transformers.BertForTokenClassification(cfg)
    batch = synthetic_batch(tokens, ids)
    assert "labels" not in batch.kwargs
    assert batch.loss(tokens(*batch.inputs)).dim() == 0


def test_a_step_trains_the_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 3))
    batch = synthetic_batch(model, (torch.zeros(8, 3, 4, 4),))
    step = build_step(model, batch, "adamw")
    first = step().item()
    for _ in range(30):
        last = step().item()
    assert last < first
