"""no-kv-cache: a Hugging Face decoder's training forwards run without the key/value cache.

A decoder built with `use_cache=True` (transformers' default) fills a DynamicCache in every
forward, training ones too: a copy of each layer's keys and values that training never reads
(the kv-cache-in-training rule). The forward is replaced on the instance by a call of the
class's (`models/hf_masks.py`, `read_positions_as_unpacked(drop_cache=True)`; an
`InstanceForward`, which copies and pickles with the model): in training mode a call that
does not say `use_cache` runs with `use_cache=False`; and since without a cache transformers
checks the position ids for packed sequences (a host sync eagerly, an explicit causal mask
while compiling or capturing), a call given neither position ids nor a padding mask has that
check answer as the model's own positions are, one sequence a row. Evaluation and generation
keep the cache; parameters, the state_dict and the config are untouched; undo removes the
replacement.
"""

from __future__ import annotations

from torch import nn

from ..models.hf_masks import (
    cache_setting,
    decoder,
    is_hf_model,
    read_positions_as_unpacked,
    trains_without_cache,
)
from ._core import Change, Outcome, Refusal, TransformContext, register_transform

ID = "no-kv-cache"


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    if not ctx.train or not is_hf_model(model) or trains_without_cache(model):
        return out
    if not ctx.allows(model, ""):
        return out
    if not cache_setting(model) or not decoder(model):
        return out
    if "forward" in model.__dict__:
        reason = "the model's forward is already replaced on the instance (another wrapper)"
        out.refusals.append(Refusal(transform=ID, module="", reason=reason))
        return out
    out.changes.append(
        Change(
            transform=ID,
            module="",
            detail="training forwards run without the key/value cache (use_cache=False), "
            "the model's own positions read as one sequence a row",
            undo=read_positions_as_unpacked(model, drop_cache=True),
        )
    )
    return out
