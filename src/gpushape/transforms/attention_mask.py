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
"""

from __future__ import annotations

import contextlib

from torch import nn

from ..models.hf_masks import (
    IMPLEMENTATION,
    attention_implementation,
    register_implementation,
    set_implementation,
    traced_mask_gap,
)
from ._core import Change, Outcome, Refusal, TransformContext, register_transform

ID = "skip-attention-mask"


def is_applied(model: nn.Module) -> bool:
    return attention_implementation(model) == IMPLEMENTATION


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    why = traced_mask_gap(model)
    if why is None or not ctx.allows(model, ""):
        return out
    try:
        register_implementation()
        set_implementation(model, IMPLEMENTATION)
    except Exception as exc:  # a release whose interfaces differ: refused, never raised
        with contextlib.suppress(Exception):  # back to what it was, where it changed
            set_implementation(model, "sdpa")
        reason = f"transformers refused the attention implementation: {type(exc).__name__}: {exc}"
        out.refusals.append(Refusal(transform=ID, module="", reason=reason[:300]))
        return out
    out.changes.append(
        Change(
            transform=ID,
            module="",
            detail="SDPA attention with no mask where no padding mask is given, also while "
            f"compiling or capturing ({why.split(' builds')[0]} built an all-true one there)",
            undo=lambda: set_implementation(model, "sdpa"),
        )
    )
    return out
