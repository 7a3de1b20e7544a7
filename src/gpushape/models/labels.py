"""The labels a Hugging Face model's own loss reads, so that a training step's trace has the
loss in it.

A `*ForCausalLM` or `*ForMaskedLM` model given `labels` computes its cross-entropy inside its
forward: the logits cast to float32, a log-softmax over the vocabulary, the NLL, and their
backward. For GPT-2 at 8 x 1024 tokens that is 6.8 ms of GPU time on the H200 as the cost model
prices it, about a sixth of the step, and a trace without labels leaves it out: the audit then
predicted 36.2 ms of kernels where the GPU ran 44.2 (benchmarks/results/loops-h200-2,
loop-hf_gpt2-eager.json; 43.0 with the loss, the foreach AdamW's kernels the rest). Training
passes labels, so the audit of a training step does too (`with_labels`).

What each task gets (`label_task`):
- causal LM: its input ids (the model shifts them itself);
- masked LM: every MASK_EVERY-th position labelled (14%, BERT trains on 15%), the rest
  IGNORE_INDEX, so masked-lm-head's fixed capacity (25%) holds them;
- sequence or image classification: class 0 for every sample.
Other models, and models that already get `labels`, are traced as given.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .heads import IGNORE_INDEX

MASK_EVERY = 7  # a masked LM's traced labels: every 7th position (14%)
CAUSAL = ("ForCausalLM", "LMHeadModel")
CLASSES = ("ForSequenceClassification", "ForImageClassification")


def takes_labels(model: nn.Module) -> bool:
    """Whether the model's class forward names `labels` (its class's: a transform may have put
    a forward of `*args, **kwargs` on the instance, masked-lm-head's)."""
    try:
        return "labels" in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False


def label_task(model: nn.Module, first: Any) -> str | None:
    """ "masked", "causal" or "classes" for a Hugging Face model (it has a `config` and its
    forward takes `labels`) of that task fed `first` (token ids for the LMs), else None."""
    if not hasattr(model, "config") or not takes_labels(model):
        return None
    name = type(model).__name__
    ids = _is_ids(first)
    if ids and name.endswith("ForMaskedLM"):
        return "masked"
    if ids and name.endswith(CAUSAL):
        return "causal"
    if name.endswith(CLASSES):
        return "classes"
    return None


def _is_ids(x: Any) -> bool:
    dtype, shape = getattr(x, "dtype", None), getattr(x, "shape", None)
    integral = dtype is not None and not dtype.is_floating_point
    return integral and shape is not None and len(shape) == 2


def labels_for(task: str, first: Any) -> torch.Tensor:
    """Labels of `task` for the batch `first` (a tensor or a TensorSpec), on its device."""
    device = getattr(first, "device", torch.device("meta"))
    if isinstance(device, str) or device is None:
        device = torch.device("meta")
    if task == "classes":
        return torch.zeros(first.shape[0], dtype=torch.long, device=device)
    if isinstance(first, torch.Tensor):
        ids = first
    else:  # a TensorSpec: its shape on the meta device
        ids = torch.zeros(tuple(first.shape), dtype=torch.long, device=device)
    if task == "causal":
        return ids
    labelled = torch.arange(ids.numel(), device=ids.device).view(ids.shape) % MASK_EVERY == 0
    return torch.where(labelled, ids, torch.full_like(ids, IGNORE_INDEX))


def with_labels(model: nn.Module, example_inputs: Any) -> Any:
    """`example_inputs` as the model's keyword arguments with the labels its task reads added,
    or unchanged where it has none or already gets them."""
    args, kwargs = _split(example_inputs)
    if "labels" in kwargs:
        return example_inputs
    first = args[0] if args else next(iter(kwargs.values()), None)
    task = label_task(model, first)
    if task is None or first is None:
        return example_inputs
    try:  # the class's forward, `self` bound to the model
        bound = inspect.signature(type(model).forward).bind_partial(model, *args, **kwargs)
    except TypeError:
        return example_inputs  # positional inputs the forward does not name: leave them
    named = dict(list(bound.arguments.items())[1:])
    if "labels" in named or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in bound.signature.parameters.values()
        if p.name in named
    ):
        return example_inputs
    return {**named, "labels": labels_for(task, first)}


def _split(example_inputs: Any) -> tuple[tuple, dict]:
    """(args, kwargs) as the tracer reads example inputs: a dict is keyword arguments, a tuple
    or list positional ones, anything else the one positional argument."""
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}
