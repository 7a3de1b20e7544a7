"""masked-lm-head: a masked LM's head and loss computed only where a label is set.

A Hugging Face `*ForMaskedLM` model runs its head (BERT: dense, GELU, LayerNorm, then the
vocabulary-wide decoder) at every position and hands all the logits to a cross-entropy that
ignores the unlabelled positions (label -100). In BERT-style training 15% of the tokens carry a
label, so 85% of the head's GEMMs, of the softmax over the vocabulary and of the decoder bias
gradient's reduction is thrown away: for BERT-base at 32 x 512 tokens that is about a quarter of
the eager step on an H200. NVIDIA's BERT pre-training gathers the masked positions first; this
transform does the same to a library model without editing its code: when `labels` are passed,
the model's forward runs the encoder, keeps the rows whose label is not -100, runs the head on
those rows alone and takes the cross-entropy there. The loss is the same number (the mean over
the labelled positions) and every gradient the same; only `logits` changes shape: it holds the
labelled positions' rows, in order (`logits[i]` belongs to the i-th labelled position of
`labels.flatten()`), which is what a masked-LM accuracy reads. Without labels (inference,
evaluation without a loss) the model runs exactly as before.

The forward is replaced on the instance (a bound method; state_dict, parameters and the class
are untouched); revert deletes it. Counting the labelled rows costs one host synchronisation a
step, so a CUDA graph cannot capture it: refused in graph mode. The numeric gate of
`optimize()` runs the model without labels, which this path never changes, so the transform
checks itself with labels: seeded labels on 15% of the example tokens, the loss and every
parameter's gradient against the original's (the same gate, `_verify.py`); a model whose
forward is not `head(encoder(...)[0])` followed by that loss fails it and is refused.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..models.heads import IGNORE_INDEX, MARK, MASKED_FRACTION, MaskedLMHead, masked_lm_head
from ._core import Change, Outcome, Refusal, TransformContext, has_hooks, register_transform
from ._verify import reference, verify

ID = "masked-lm-head"
CHECK_SAMPLES = 2  # the self-check runs the model in float64 on this many samples


def is_applied(model: nn.Module) -> bool:
    return isinstance(model.__dict__.get(MARK), MaskedLMHead)


def _forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The model's forward, with the head and loss on the labelled rows when labels are given."""
    spec: MaskedLMHead = self.__dict__[MARK]
    original = type(self).forward.__get__(self)
    bound = inspect.signature(original).bind(*args, **kwargs)
    arguments = dict(bound.arguments)
    for name, param in inspect.signature(original).parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    labels = arguments.pop("labels", None)
    if labels is None:
        return original(*args, **kwargs)
    return_dict = arguments.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(getattr(self, "config", None), "use_return_dict", True)
    outputs = getattr(self, spec.base_name)(**arguments, return_dict=True)
    hidden = outputs[0]
    flat = labels.reshape(-1)
    keep = (flat != IGNORE_INDEX).nonzero().squeeze(-1)  # the one host sync: the row count
    rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
    logits = getattr(self, spec.head_name)(rows)
    loss = F.cross_entropy(logits.view(-1, spec.vocab_size), flat.index_select(0, keep))
    if not return_dict:
        return (loss, logits, *tuple(outputs.to_tuple()[2:]))
    from transformers.modeling_outputs import MaskedLMOutput

    return MaskedLMOutput(
        loss=loss,
        logits=logits,
        hidden_states=getattr(outputs, "hidden_states", None),
        attentions=getattr(outputs, "attentions", None),
    )


class _Labelled(nn.Module):
    """A masked LM's training forward with fixed labels: (the loss, the labelled rows' logits),
    what the self-check compares."""

    def __init__(self, model: nn.Module, labels: torch.Tensor):
        super().__init__()
        self.model, self.labels = model, labels

    def forward(self, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(*inputs, labels=self.labels)
        logits = out.logits
        if logits.shape[:-1] == self.labels.shape:  # the original: every position's row
            logits = logits[self.labels != IGNORE_INDEX]
        return out.loss, logits


def _check_inputs(inputs: tuple) -> tuple[tuple, torch.Tensor] | None:
    """A few samples of the example inputs and seeded labels on ~15% of their tokens (at least
    one), or None where the first input is not token ids."""
    ids = inputs[0] if inputs else None
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dim() != 2:
        return None
    small = tuple(
        x[:CHECK_SAMPLES].clone() if isinstance(x, torch.Tensor) and x.dim() else x for x in inputs
    )
    ids = small[0]
    gen = torch.Generator().manual_seed(0)
    masked = torch.rand(ids.shape, generator=gen) < MASKED_FRACTION
    masked.view(-1)[0] = True
    labels = torch.where(masked.to(ids.device), ids, torch.full_like(ids, IGNORE_INDEX))
    return small, labels


def _install(model: nn.Module, spec: MaskedLMHead) -> None:
    model.__dict__[MARK] = spec
    model.forward = types.MethodType(_forward, model)


def _remove(model: nn.Module) -> None:
    model.__dict__.pop(MARK, None)
    model.__dict__.pop("forward", None)


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    spec, why = masked_lm_head(model)
    if spec is None or is_applied(model) or not ctx.train or not ctx.allows(model, ""):
        if why:
            out.refusals.append(Refusal(transform=ID, module="", reason=why))
        return out
    refuse = None
    if ctx.mode == "graph":
        refuse = "counting the labelled rows syncs with the host, which a CUDA graph cannot replay"
    elif has_hooks(model):
        refuse = "the model has hooks, which would see logits of another shape"
    elif "forward" in model.__dict__:
        refuse = "the model's forward is already replaced on the instance (another wrapper)"
    elif "labels" not in inspect.signature(type(model).forward).parameters:
        refuse = "the model's forward names no `labels` argument"
    if refuse is None:
        refuse = _self_check(model, spec, ctx.example_inputs)
    if refuse:
        out.refusals.append(Refusal(transform=ID, module="", reason=refuse))
        return out
    _install(model, spec)
    out.changes.append(
        Change(
            transform=ID,
            module=spec.head_name,
            detail=f"head and loss on the labelled positions only (vocabulary {spec.vocab_size})",
            undo=lambda: _remove(model),
        )
    )
    return out


def _self_check(model: nn.Module, spec: MaskedLMHead, inputs: tuple) -> str | None:
    """None when the labelled path matches the original's loss and gradients, else why not."""
    if any(p.is_meta for p in model.parameters()):
        return None  # a meta model is rewritten and audited, never run (optimize says so)
    prepared = _check_inputs(inputs)
    if prepared is None:
        return "the first input is not a batch of token ids to label"
    small, labels = prepared
    try:
        ref = reference(_Labelled(model, labels), small)
        _install(model, spec)
        try:
            result = verify(_Labelled(model, labels), small, ref)
        finally:
            _remove(model)
    except Exception as exc:  # a model this path does not fit is refused, never raised
        return f"the labelled path failed to run: {type(exc).__name__}: {str(exc)[:200]}"
    if not result.passed:
        return f"the labelled path does not match the original: {result.worst}"
    return None
