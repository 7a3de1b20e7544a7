"""Where a library model's masked-LM head is: the part that turns each position's hidden state
into vocabulary logits, which the loss then reads only where a label is set.

Hugging Face's `*ForMaskedLM` models run `head(base(...)[0])` and a cross-entropy over every
position with the unlabelled ones ignored (label -100). Training masks ~15% of the tokens, so
~85% of the head's work (a vocabulary-wide GEMM forward and backward, the softmax over the
vocabulary, the bias gradient's reduction over every row) is thrown away. `masked_lm_head`
finds the pieces a rewrite needs (gpushape's `masked-lm-head` transform and the
`dense-mlm-head` rule share it) without knowing the model's class; `capacity_rows` is how many
rows the rewrite keeps, which both use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

IGNORE_INDEX = -100  # what transformers' losses (and torch's cross_entropy) skip
MASKED_FRACTION = 0.15  # BERT's convention: the share of positions that carry a label
# The share of positions masked-lm-head runs the head on, fixed per shape so that no step waits
# for the host to count the labels. 15% masking is standard; at 32 x 512 = 16,384 positions the
# labelled count is 2,458 +- 46 (binomial), so 25% (4,096 rows) is 36 standard deviations away.
# Short batches fluctuate more (32 positions: 4.8 +- 2.0 against 8 rows).
CAPACITY = 0.25
ROW_MULTIPLE = 8  # rows rounded up to this, for the head's GEMMs
MARK = "_gpushape_masked_lm"  # the attribute masked-lm-head sets on a model it rewrote


@dataclass(frozen=True)
class MaskedLMHead:
    base_name: str
    """Attribute of the model holding the encoder (`model.base_model`)."""
    head_name: str
    """Attribute of the model holding the head, the child whose subtree holds the output
    embeddings."""
    vocab_size: int


def is_masked_lm(model: nn.Module) -> bool:
    return type(model).__name__.endswith("ForMaskedLM") and hasattr(model, "base_model")


def masked_lm_head(model: nn.Module) -> tuple[MaskedLMHead | None, str]:
    """(the head, "") where `model` is a Hugging Face-style masked LM whose head is one child,
    else (None, why not) -- why is "" for a model that is no masked LM at all."""
    if not is_masked_lm(model):
        return None, ""
    get_out = getattr(model, "get_output_embeddings", None)
    out_emb = get_out() if callable(get_out) else None
    if not isinstance(out_emb, nn.Module):
        return None, "the model names no output embeddings"
    base = model.base_model
    base_name = next((n for n, c in model.named_children() if c is base), None)
    if base_name is None:
        return None, "the encoder is not a child of the model"
    owners = [
        n
        for n, child in model.named_children()
        if child is not base and any(m is out_emb for m in child.modules())
    ]
    if len(owners) != 1 or owners[0] == base_name:
        return None, "the head is not one child of the model (its layers are spread out)"
    others = [
        n
        for n, child in model.named_children()
        if n not in (base_name, owners[0]) and any(True for _ in child.parameters())
    ]
    if others:
        return None, f"layers outside the encoder and the head ({', '.join(others)}) hold weights"
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if not vocab:
        return None, "the config has no vocab_size"
    return MaskedLMHead(base_name, owners[0], int(vocab)), ""


def capacity_rows(positions: int) -> int:
    """The rows masked-lm-head keeps of `positions` label positions: CAPACITY of them, rounded
    up to a multiple of ROW_MULTIPLE, at most all of them."""
    rows = math.ceil(CAPACITY * positions)
    return min(positions, -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE)
