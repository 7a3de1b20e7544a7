"""Copies between layouts and the memory families that price them (`layout.copy_kind` says how
a copy reads its source; `families.op_family` and `cost.hidden_copy_seconds` price it)."""

from __future__ import annotations

from .layout import channels_last_strides
from .records import TensorMeta

# Copies between layouts (`layout.copy_kind`), by how they read their source; roll (a family
# of its own in families.py) copies as many times as it has dimensions to roll.
COPY_FAMILIES = {"permuted": "permuted_copy", "transposed": "transposed_copy"}
# ... and a transposed copy of a channels_last-strided tensor into NCHW, the other way round
# (a gradient put back in an NCHW convolution's layout): measured apart (on the H100 0.17 of the
# copy rate against the other direction's 0.28), else priced as the NCHW-to-NHWC copy
TRANSPOSED_TO_NCHW = "transposed_copy_nchw"
# ... and a cat of one tensor read permuted (a key/value cache's first append, GPT-2's
# (B, T, H, D) viewed as (B, H, T, D), onto an empty cache): PyTorch's cat kernel's strided
# path, on the H200 half the permuted copy's rate (GPT-2's 24 cache cats, 0.99 ms a step:
# benchmarks/hardware/permuted_cat_from_runs.py; on an H100 0.21 of the copy rate,
# benchmarks/results/probe-h100/README.md); unmeasured, priced as a permuted copy.
PERMUTED_CAT, JOINED = "permuted_cat", ("aten.cat", "aten.stack")
# ... and a cat or stack of several tensors any of which is read permuted (the backward of
# `qkv.unbind(0)` stacking SDPA's dQ, dK and dV, laid out as the permuted views q, k and v
# were, in timm's ViT and Swin): the same kernel, faster than a lone append: on an H100 0.33
# (ViT-B/16's 12 stacks a step) and 0.34 (Swin-T's) of the copy rate against the cache
# appends' 0.21, on the H200 0.24 against 0.18 (benchmarks/hardware/permuted_stack_from_runs.py);
# unmeasured, priced as PERMUTED_CAT.
PERMUTED_STACK = "permuted_stack"
COPIES = frozenset({*COPY_FAMILIES.values(), TRANSPOSED_TO_NCHW, PERMUTED_CAT, PERMUTED_STACK})


def copy_family(source: TensorMeta, kind: str) -> str:
    """The family of a copy of `source` between layouts (`layout.copy_kind`): a transposed copy
    of a channels_last-strided tensor goes into NCHW (`TRANSPOSED_TO_NCHW`)."""
    if kind == "transposed" and channels_last_strides(source):
        return TRANSPOSED_TO_NCHW
    return COPY_FAMILIES[kind]
