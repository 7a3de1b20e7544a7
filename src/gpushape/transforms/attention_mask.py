"""skip-attention-mask: a Hugging Face model keeps SDPA's flash kernel under torch.compile and
in a CUDA graph, where its transformers release would build an explicit all-true mask.

What goes wrong and why is in `models/hf_masks.py`. The rewrite switches the model's attention
implementation (every sub-config, through transformers' own `set_attn_implementation`) to one
registered with transformers' public attention interfaces: the same SDPA attention function,
and a mask function that passes no mask exactly where transformers' eager path passes none, and
builds transformers' SDPA mask everywhere else (a padding mask the caller gives is kept). In
eager mode nothing changes at all: the eager path already skipped the mask. Parameters,
buffers, the state_dict and the saved config are untouched (transformers does not save the
attention implementation); undo switches back to "sdpa".

It applies only where `traced_mask_gap` says the installed transformers has the gap, so on a
release that already skips the mask it finds nothing to do.

A decoder run with no key/value cache (use_cache=False) and no padding mask meets another
mask there (`packed_mask_gap`): transformers checks the position ids for several sequences
packed into a row, cannot read them while tracing or capturing, and builds the causal mask.
For that one (a model configured with use_cache=False) the forward is replaced on the
instance (`read_positions_as_unpacked`): a call given neither position ids nor a padding mask
makes its positions itself, which never pack, so the check answers "one sequence a row" as it
does eagerly; undo removes the replacement.
"""

from __future__ import annotations

import contextlib

from torch import nn

from ..models.hf_masks import (
    IMPLEMENTATION,
    attention_implementation,
    cache_setting,
    packed_mask_gap,
    read_positions_as_unpacked,
    reads_positions_as_unpacked,
    register_implementation,
    set_implementation,
    traced_mask_gap,
)
from ._core import Change, Outcome, Refusal, TransformContext, register_transform

ID = "skip-attention-mask"


def is_applied(model: nn.Module) -> bool:
    return attention_implementation(model) == IMPLEMENTATION or reads_positions_as_unpacked(model)


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    uncached = cache_setting(model) is False  # configured so: the packed-sequence check runs
    why, packed = traced_mask_gap(model), packed_mask_gap(model) if uncached else None
    if (why is None and packed is None) or not ctx.allows(model, ""):
        return out
    if why is not None and not _switch(model, why, out):
        return out
    if packed is not None and "forward" in model.__dict__:
        reason = "the model's forward is already replaced on the instance (another wrapper)"
        out.refusals.append(Refusal(transform=ID, module="", reason=reason))
    elif packed is not None:
        out.changes.append(
            Change(
                transform=ID,
                module="",
                detail="transformers' packed-sequence check reads the model's own positions "
                "as one sequence a row, also while compiling or capturing (run without a "
                "cache, it built a causal mask there)",
                undo=read_positions_as_unpacked(model),
            )
        )
    return out


def _switch(model: nn.Module, why: str, out: Outcome) -> bool:
    """The attention implementation whose mask function skips the all-true mask."""
    try:
        register_implementation()
        set_implementation(model, IMPLEMENTATION)
    except Exception as exc:  # a release whose interfaces differ: refused, never raised
        with contextlib.suppress(Exception):  # back to what it was, where it changed
            set_implementation(model, "sdpa")
        reason = f"transformers refused the attention implementation: {type(exc).__name__}: {exc}"
        out.refusals.append(Refusal(transform=ID, module="", reason=reason[:300]))
        return False
    out.changes.append(
        Change(
            transform=ID,
            module="",
            detail="SDPA attention with no mask where no padding mask is given, also while "
            f"compiling or capturing ({why.split(' builds')[0]} built an all-true one there)",
            undo=lambda: set_implementation(model, "sdpa"),
        )
    )
    return True
