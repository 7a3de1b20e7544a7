"""A synthetic training batch for any model: inputs with realistic values, and its loss.

The example inputs a model comes with (`gpushape.models.resolve_model`) are shapes: token ids
of zeros, images of noise. A training step needs more: token ids spread over the vocabulary (an
embedding's backward where every id is 0 is not the one real text runs), and a loss with the
labels the model's task takes:
- a Hugging Face model whose forward takes `labels` (`models.labels.label_task`): a causal LM
  is given its input ids (the model shifts them), a masked LM 15% of its tokens replaced by
  the mask id and labelled (the rest -100, as BERT is trained), a sequence or image
  classifier a random class per sample;
- any other model: a classifier's logits (batch x classes) take cross-entropy against random
  classes, a language model's (batch x seq x vocab, fed token ids) against its input ids;
  anything else the mean of its first output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..models.labels import label_task

MASKED_FRACTION = 0.15
IGNORE = -100


@dataclass
class Batch:
    """What one training step feeds the model, and how its output becomes the loss."""

    inputs: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss: Callable[[Any], torch.Tensor] = None  # type: ignore[assignment]
    task: str = "mean of the output"
    samples: int = 0
    tokens: int = 0
    """Tokens per step for token models (batch x sequence), else 0."""

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the step reads from the batch (what a CUDA graph keeps static)."""
        return [t for t in (*self.inputs, *self.kwargs.values()) if isinstance(t, torch.Tensor)]


def first_tensor(out: Any) -> torch.Tensor:
    """A model's output tensor: itself, a library output's loss-free first tensor (the logits),
    or the first tensor of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return next(v for v in out if isinstance(v, torch.Tensor))


def vocabulary(model: nn.Module) -> int | None:
    """The token-id range a model embeds: its config's vocab_size or its first Embedding's."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if size:
        return int(size)
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return embedding.num_embeddings if embedding is not None else None


def synthetic_batch(model: nn.Module, example_inputs: tuple, *, seed: int = 0) -> Batch:
    """The example inputs with realistic values, labels where the task takes them, the loss."""
    gen = torch.Generator().manual_seed(seed)
    first = example_inputs[0] if example_inputs else None
    vocab = vocabulary(model)
    tokens = isinstance(first, torch.Tensor) and not first.is_floating_point()
    inputs = tuple(
        _random_ids(t, vocab, gen) if tokens and i == 0 else _random_like(t, gen)
        for i, t in enumerate(example_inputs)
    )
    samples = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1
    n_tokens = int(first.numel()) if tokens and first.dim() == 2 else 0
    batch = Batch(inputs=inputs, samples=samples, tokens=n_tokens)
    task = label_task(model, inputs[0] if inputs else None)
    if task is not None:
        _library_labels(model, batch, gen, task)
    else:
        batch.loss, batch.task = _plain_loss(batch, vocab, gen)
    return batch


def _random_ids(t: torch.Tensor, vocab: int | None, gen: torch.Generator) -> torch.Tensor:
    if not vocab or t.device.type == "meta":
        return t
    return torch.randint(0, vocab, t.shape, generator=gen).to(t.device, t.dtype)


def _random_like(t: Any, gen: torch.Generator) -> Any:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.device.type == "meta":
        return t
    noise = torch.randn(t.shape, generator=gen).to(t.device, t.dtype)
    return noise.contiguous(memory_format=_format_of(t))


def _format_of(t: torch.Tensor) -> torch.memory_format:
    channels_last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    return (
        torch.channels_last if channels_last and not t.is_contiguous() else torch.contiguous_format
    )


def _library_labels(model: nn.Module, batch: Batch, gen: torch.Generator, task: str) -> None:
    """Labels for a Hugging Face model's own loss (`output.loss`), by its task
    (`models.labels.label_task`)."""
    x = batch.inputs[0]
    if task == "masked":
        masked = torch.rand(x.shape, generator=gen).to(x.device) < MASKED_FRACTION
        mask_id = getattr(model.config, "mask_token_id", None)
        mask_id = mask_id if mask_id is not None else min(103, (vocabulary(model) or 1) - 1)
        labels = torch.where(masked, x, torch.full_like(x, IGNORE))
        batch.inputs = (torch.where(masked, torch.full_like(x, mask_id), x), *batch.inputs[1:])
        batch.kwargs["labels"], batch.task = labels, "masked LM, 15% of tokens"
    elif task == "causal":
        batch.kwargs["labels"], batch.task = x, "causal LM (next token)"
    else:
        classes = int(getattr(model.config, "num_labels", 2))
        batch.kwargs["labels"] = torch.randint(0, classes, (x.shape[0],), generator=gen).to(
            x.device
        )
        batch.task = f"classification, {classes} classes"
    batch.loss = _library_loss


def _library_loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is None:
        loss = out[0] if isinstance(out, (tuple, list)) else out
    return loss


def _plain_loss(batch: Batch, vocab: int | None, gen: torch.Generator):
    x = batch.inputs[0] if batch.inputs else None
    classes: dict[str, torch.Tensor] = {}

    def loss(out: Any) -> torch.Tensor:
        logits = first_tensor(out)
        if logits.dim() == 2 and x is not None and logits.shape[0] == x.shape[0]:
            if "y" not in classes:  # drawn once, on the first step, where the logits are
                y = torch.randint(0, logits.shape[1], (logits.shape[0],), generator=gen)
                classes["y"] = y.to(logits.device)
            return F.cross_entropy(logits.float(), classes["y"])
        if (
            logits.dim() == 3
            and x is not None
            and not x.is_floating_point()
            and logits.shape[:2] == x.shape
        ):
            if vocab is None or logits.shape[2] >= vocab:  # an LM's: the ids are its classes
                return F.cross_entropy(logits.flatten(0, 1).float(), x.flatten())
            if "tokens" not in classes:  # a tagger's: a class per token, drawn once
                y = torch.randint(0, logits.shape[2], x.shape, generator=gen)
                classes["tokens"] = y.to(logits.device)
            return F.cross_entropy(logits.flatten(0, 1).float(), classes["tokens"].flatten())
        return logits.float().mean()

    task = "cross-entropy on the logits" if x is not None else "mean of the output"
    return loss, task
