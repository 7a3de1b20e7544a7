"""masked-lm-head: a masked LM's head and loss computed only where a label is set.

A Hugging Face `*ForMaskedLM` model runs its head (BERT: dense, GELU, LayerNorm, then the
vocabulary-wide decoder) at every position and hands all the logits to a cross-entropy that
ignores the unlabelled positions (label -100). In BERT-style training 15% of the tokens carry a
label, so 85% of the head's GEMMs, of the softmax over the vocabulary and of the decoder bias
gradient's reduction is thrown away: for BERT-base at 32 x 512 tokens that is about a quarter of
the eager step on an H200. NVIDIA's BERT pre-training gathers the masked positions first; this
transform does the same to a library model without editing its code: when `labels` are passed,
the model's forward runs the encoder, gathers the labelled rows, runs the head on those rows
and takes the cross-entropy there. The loss is the same number (the mean over the labelled
positions) and every gradient the same; only `logits` changes shape.

No step waits for the host. The rows kept are a fixed number per shape, K = `capacity_rows(N)`
of the N label positions (25%, rounded up to a multiple of 8), and are picked on the device:
a running count of the labels (`cumsum`) and a binary search of it (`searchsorted`) give the
positions of the 1st, 2nd, ... K-th label, in order. So the step has static shapes and no
sync: a CUDA graph captures it, torch.compile traces it whole, and eager mode keeps the launch
queue full. `logits` holds K rows: the first `count` (the number of labels) are the labelled
positions' rows in order (`logits[i]` belongs to the i-th labelled position of
`labels.flatten()`, which is what a masked-LM accuracy reads); the rest are filler (the last
position's row, with label -100, which the loss ignores). More than K labels is an error,
checked on the device without a sync (`torch._assert_async`): in eager mode on the CPU a
RuntimeError at once (CPU code compiled by Inductor aborts the process with the message), on
CUDA a device-side assert (which ends the process's CUDA context). Without labels
(inference, evaluation without a loss) the model runs exactly as before.

The forward is replaced on the instance (an `InstanceForward`, which copies and pickles with
the model; state_dict, parameters and the class are untouched); revert deletes it. The numeric
gate of `optimize()` runs the model without labels, which this path never changes, so the
transform checks itself with labels: seeded labels on 15% of the example tokens (at most K),
the loss and every parameter's gradient against the original's (the same gate, `_verify.py`);
a model whose forward is not `head(encoder(...)[0])` followed by that loss fails it and is
refused.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..models.heads import (
    CAPACITY,
    IGNORE_INDEX,
    MARK,
    MASKED_FRACTION,
    MaskedLMHead,
    capacity_rows,
    masked_lm_head,
)
from ..models.instance_forward import InstanceForward
from ._core import Change, Outcome, Refusal, TransformContext, has_hooks, register_transform
from ._verify import reference, verify

ID = "masked-lm-head"
CHECK_SAMPLES = 2  # the self-check runs the model in float64 on this many samples


def is_applied(model: nn.Module) -> bool:
    return isinstance(model.__dict__.get(MARK), MaskedLMHead)


def _forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The model's forward, with the head and loss on K gathered rows when labels are given."""
    spec: MaskedLMHead = self.__dict__[MARK]
    # the class's forward as a partial, not a bound method made with __get__ (which
    # torch.compile's dynamo in torch 2.11 does not trace: a graph break on every call)
    original = functools.partial(type(self).forward, self)
    signature = inspect.signature(type(self).forward)
    arguments = dict(signature.bind(self, *args, **kwargs).arguments)
    arguments.pop(next(iter(signature.parameters)))  # self
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    labels = arguments.pop("labels", None)
    if labels is None:
        return original(*args, **kwargs)
    return_dict = arguments.pop("return_dict", None)
    if return_dict is None:  # what transformers' `can_return_tuple` reads
        return_dict = getattr(getattr(self, "config", None), "return_dict", True)
    outputs = getattr(self, spec.base_name)(**arguments, return_dict=True)
    hidden = outputs[0]  # (B, T, C)
    flat = labels.reshape(-1)  # (N,)
    positions, row_labels = first_labelled(flat, capacity_rows(flat.numel()))  # (K,), (K,)
    rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)  # (K, C)
    logits = getattr(self, spec.head_name)(rows)  # (K, V)
    loss = F.cross_entropy(logits.view(-1, spec.vocab_size), row_labels)
    from transformers.modeling_outputs import MaskedLMOutput

    output = MaskedLMOutput(
        loss=loss,
        logits=logits,
        hidden_states=getattr(outputs, "hidden_states", None),
        attentions=getattr(outputs, "attentions", None),
    )
    return output if return_dict else output.to_tuple()


def first_labelled(flat: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, labels), both (rows,): the positions of the first `rows` labels of `flat` in
    order and their labels, then filler (the last position, label -100). Static shapes and no
    host sync: a running count and a binary search in it, gathers only (no scatter, so
    deterministic); more labels than `rows` fails an assert on the device."""
    n = flat.numel()
    keep = flat != IGNORE_INDEX  # (N,)
    torch._assert_async(
        keep.sum() <= rows,
        f"masked-lm-head: more than {rows} of the {n} label positions carry a label; it keeps "
        f"rows for {CAPACITY:.0%} of them: label fewer, or revert masked-lm-head",
    )
    ends = keep.cumsum(0)  # (N,) labels up to and including each position
    slots = torch.arange(1, rows + 1, device=flat.device)  # (K,) the 1st, 2nd, ... label
    positions = torch.searchsorted(ends, slots)  # (K,) where each is reached; N past the last
    filler = positions == n
    positions = positions.clamp(max=max(n - 1, 0))
    return positions, flat.index_select(0, positions).masked_fill(filler, IGNORE_INDEX)


class _Labelled(nn.Module):
    """A masked LM's training forward with fixed labels: (the loss, the labelled rows' logits),
    what the self-check compares: the original's rows where a label is set, the rewritten
    path's first `count` rows (the rest are filler)."""

    def __init__(self, model: nn.Module, labels: torch.Tensor):
        super().__init__()
        self.model, self.labels = model, labels

    def forward(self, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(*inputs, labels=self.labels)
        kept = self.labels != IGNORE_INDEX
        if out.logits.shape[:-1] == self.labels.shape:  # the original: every position's row
            return out.loss, out.logits[kept]
        return out.loss, out.logits[: int(kept.sum())]


def _check_inputs(inputs: tuple) -> tuple[tuple, torch.Tensor] | None:
    """A few samples of the example inputs and seeded labels on ~15% of their tokens (at least
    one, at most `capacity_rows`), or None where the first input is not token ids."""
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
    masked.view(-1)[masked.view(-1).cumsum(0) > capacity_rows(masked.numel())] = False
    labels = torch.where(masked.to(ids.device), ids, torch.full_like(ids, IGNORE_INDEX))
    return small, labels


def _install(model: nn.Module, spec: MaskedLMHead) -> None:
    model.__dict__[MARK] = spec
    model.forward = InstanceForward(_forward, model)


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
    if has_hooks(model):
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
            detail=(
                f"head and loss on {CAPACITY:.0%} of the positions, the labelled ones first "
                f"(vocabulary {spec.vocab_size}); more labels than that fail a device-side "
                "assert"
            ),
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
