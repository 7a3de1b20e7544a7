"""transformers releases up to 5.17 build an explicit all-true attention mask while tracing
(torch.compile) or capturing, where later ones skip it. `old_masks()` makes the installed
release behave like the old ones for the length of a block, so the rule and the
skip-attention-mask transform are tested whichever release CI installs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def old_masks() -> Iterator[None]:
    """transformers' SDPA mask skips turned off while `is_tracing()` is true, as up to 5.17."""
    from transformers import masking_utils as mu

    bidirectional, causal = mu._ignore_bidirectional_mask_sdpa, mu._ignore_causal_mask_sdpa

    def old_bidirectional(padding_mask, *args, **kwargs):
        if mu.is_tracing(padding_mask):
            return False
        return bidirectional(padding_mask, *args, **kwargs)

    def old_causal(padding_mask, *args, **kwargs):
        if mu.is_tracing(padding_mask):
            return False
        return causal(padding_mask, *args, **kwargs)

    mu._ignore_bidirectional_mask_sdpa, mu._ignore_causal_mask_sdpa = old_bidirectional, old_causal
    try:
        yield
    finally:
        mu._ignore_bidirectional_mask_sdpa, mu._ignore_causal_mask_sdpa = bidirectional, causal


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """transformers' `is_tracing()` true inside the block, as under torch.compile or capture."""
    from transformers import masking_utils

    from gpushape.models.hf_masks import _tracing

    with _tracing(masking_utils):
        yield
