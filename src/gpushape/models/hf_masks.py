"""Hugging Face attention masks under torch.compile and CUDA graph capture.

transformers (5.x up to at least 5.17) builds its attention mask in `masking_utils`: with SDPA
and no padding mask it normally passes no mask at all (`is_causal=True` for a decoder), which
lets SDPA take its flash kernel. But it decides so only when `is_tracing()` is false, and
`is_tracing()` is true under torch.compile (dynamo) and while a CUDA stream captures. There it
materialises an all-true boolean mask, and SDPA leaves flash: measured on the H200, torch.compile
of BERT-base MLM lowered attention to the math path (fp32 score GEMMs, 0.67x eager), and the
captured GPT-2 step ran 966 kernels against eager's 611. Later transformers releases skip the
mask whenever no padding mask is given; `traced_mask_gap` tells which kind is installed by
asking its own skip functions, with `is_tracing` reporting true for the length of the call.

The fix (`skip-attention-mask`) keeps the model's attention function and changes only the mask
it gets: an attention implementation registered under `IMPLEMENTATION` through transformers'
public `AttentionInterface` / `AttentionMaskInterface`, whose attention is transformers' own
SDPA function and whose mask function returns no mask exactly where transformers' eager path
would skip it (no padding mask given, no sliding window reached), and otherwise builds
transformers' SDPA mask. A padding mask the caller passes is always kept.

Run with no key/value cache (`use_cache=False`) and no padding mask, a decoder meets another
mask there: transformers checks the position ids for several sequences packed into a row,
cannot read them while tracing, and builds the full causal mask (`packed_mask_gap`, asked of
its own check). `read_positions_as_unpacked` replaces the model's forward on the instance so
that a call given neither position ids nor a padding mask, whose positions the model makes
itself, has that check answer "one sequence a row", as it does eagerly; with `drop_cache` it
also drops the cache from training forwards (no-kv-cache). `meta_padding_masks` answers the
checks a trace on the meta device cannot (mask and position values).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn

from .instance_forward import InstanceForward, instance_forward

IMPLEMENTATION = "gpushape_sdpa"  # the attention implementation skip-attention-mask sets
MASK_BUILDERS = ("create_causal_mask", "create_bidirectional_mask")
PACKED_CHECK = "find_packed_sequence_indices"
CAUSAL = MASK_BUILDERS[:1]


def _masking_utils() -> Any | None:
    try:
        from transformers import masking_utils
    except Exception:  # transformers absent or broken: no Hugging Face model to fix
        return None
    return masking_utils


def attention_implementation(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) if config is not None else None


def is_hf_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.")


def builds_masks_in_masking_utils(model: nn.Module, builders=MASK_BUILDERS) -> bool:
    """Whether the model's code makes its masks with `masking_utils` (its module, or its base
    model's, imports one of `builders`: `create_causal_mask`, `create_bidirectional_mask`)."""
    classes = {type(model)}
    base = getattr(model, "base_model", None)
    if isinstance(base, nn.Module):
        classes.add(type(base))
    for cls in classes:
        module = sys.modules.get(cls.__module__)
        if module is not None and any(hasattr(module, name) for name in builders):
            return True
    return False


@contextmanager
def _tracing(masking_utils: Any):
    """`masking_utils.is_tracing` reports true inside the block (the state under compile)."""
    saved = masking_utils.is_tracing
    masking_utils.is_tracing = lambda *args, **kwargs: True
    try:
        yield
    finally:
        masking_utils.is_tracing = saved


def _materialises_when_tracing() -> bool:
    """Whether this transformers' SDPA mask skip is off while tracing for a model given no
    padding mask (asked of its own functions; False where they are not found)."""
    mu = _masking_utils()
    bidirectional = getattr(mu, "_ignore_bidirectional_mask_sdpa", None)
    causal = getattr(mu, "_ignore_causal_mask_sdpa", None)
    if mu is None or bidirectional is None or causal is None:
        return False
    try:
        with _tracing(mu):
            return not bidirectional(None, 128) or not causal(None, 128, 128, 0, 0)
    except TypeError:  # another signature: a release this check does not know
        return False


def traced_mask_gap(model: nn.Module) -> str | None:
    """Why `model` gets an explicit all-true attention mask under torch.compile or CUDA graph
    capture (the installed transformers, its SDPA attention, its masks made by masking_utils),
    or None where it does not."""
    if not is_hf_model(model) or attention_implementation(model) != "sdpa":
        return None
    mu = _masking_utils()
    if mu is None or not builds_masks_in_masking_utils(model):
        return None
    import transformers

    if not _materialises_when_tracing():
        return None
    return (
        f"transformers {transformers.__version__} builds an explicit all-true attention mask "
        "while torch.compile traces or a CUDA stream captures (its `is_tracing()` check), so "
        "SDPA leaves its flash kernel there though the model is given no padding mask"
    )


def traced_mask_strided(model: nn.Module) -> bool | None:
    """Whether the all-true mask this transformers builds for `model` while tracing is strided
    in its last dimension (None: its `sdpa_mask` could not be asked). torch.compile lowers SDPA
    with such a mask to the math path. 5.17 expands a bidirectional mask from one element
    (BERT's), and builds a causal one whole (GPT-2's: cuDNN's masked kernel)."""
    mu = _masking_utils()
    causal = decoder(model)
    function = getattr(mu, "causal_mask_function" if causal else "bidirectional_mask_function", 0)
    try:
        with _tracing(mu):
            mask = mu.sdpa_mask(batch_size=2, q_length=16, kv_length=16, mask_function=function,
                                allow_is_causal_skip=causal, allow_is_bidirectional_skip=not causal,
                                device="cpu")  # fmt: skip
        return mask.stride(-1) != 1
    except Exception:  # no mask (no gap), or a release this check does not know
        return None


def _packs_when_tracing() -> bool:
    """Whether this transformers' packed-sequence check hands back a packing it could not check
    while tracing (it then builds an explicit mask; asked of its own function)."""
    mu = _masking_utils()
    find = getattr(mu, PACKED_CHECK, None)
    if find is None:
        return False
    import torch

    try:
        with _tracing(mu):
            return find(torch.arange(4).unsqueeze(0)) is not None
    except Exception:  # another signature: a release this check does not know
        return False


def packed_mask_gap(model: nn.Module) -> str | None:
    """Why a model run with no key/value cache and no padding mask (a decoder trained with
    `use_cache=False`; `meta_padding_masks` counts the calls) gets an explicit causal mask
    under torch.compile or CUDA graph capture, or None where its transformers does not do so
    (or skip-attention-mask already reads its positions: `read_positions_as_unpacked`).
    transformers then checks the position ids for several sequences packed into a row; while
    tracing it cannot read them, keeps the packing it computed, and builds the full causal
    mask, so SDPA leaves flash."""
    if not is_hf_model(model) or attention_implementation(model) not in ("sdpa", IMPLEMENTATION):
        return None
    if reads_positions_as_unpacked(model) or not decoder(model):
        return None
    if _masking_utils() is None or not _packs_when_tracing():
        return None
    import transformers

    return (
        f"run with no key/value cache (use_cache=False), transformers "
        f"{transformers.__version__} checks the position ids for packed sequences, which it "
        "cannot read while torch.compile traces or a CUDA stream captures, so it builds an "
        "explicit causal mask there and SDPA leaves its flash kernel"
    )


def cache_setting(model: nn.Module) -> Any:
    """The model's configured `use_cache` (None where its config has none)."""
    return getattr(getattr(model, "config", None), "use_cache", None)


def decoder(model: nn.Module) -> bool:
    """A decoder-only model (not an encoder-decoder) whose code makes causal masks with
    masking_utils: its config says it is a decoder or does not say (LLaMA's, GPT-2's), or it
    generates text (GPT-NeoX's config says `is_decoder=False` of its causal LM); an encoder
    (BERT's `is_decoder=False`, no generation) is not."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    says = getattr(config, "is_decoder", None)
    can_generate = getattr(model, "can_generate", None)
    generates = bool(can_generate()) if callable(can_generate) else False
    if says is False and not generates:
        return False
    return builds_masks_in_masking_utils(model, CAUSAL)


def reads_positions_as_unpacked(model: nn.Module) -> bool:
    return instance_forward(model) in (_unpacked_forward, _uncached_forward)


def trains_without_cache(model: nn.Module) -> bool:
    return instance_forward(model) is _uncached_forward


def read_positions_as_unpacked(model: nn.Module, *, drop_cache: bool = False) -> Any:
    """Replace `model.forward` on the instance so that a call given neither position ids nor a
    padding mask runs with transformers' packed-sequence check answering "one sequence a row":
    the model then makes its positions itself (an arange), which never pack several sequences,
    so this is the answer the check gives eagerly, now also where it cannot look (while
    torch.compile traces or a stream captures). A call that passes either is left alone.
    `drop_cache`: a call in training mode that does not say `use_cache` also runs without the
    key/value cache (no-kv-cache); evaluation and generation keep it.
    Returns the undo. The check is swapped module-wide for the length of such a call (a model
    of another thread calling transformers' mask functions meanwhile would see it too). Set
    as an `InstanceForward`: a deep copy or a pickle of the model runs its own parameters."""
    if "forward" in model.__dict__:
        raise ValueError("the model's forward is already replaced on the instance")
    forward = type(model).forward
    names = list(inspect.signature(forward).parameters)[1:]  # after self
    _WATCHED_AT[forward] = tuple((n, names.index(n) if n in names else None) for n in WATCHED)
    model.forward = InstanceForward(_uncached_forward if drop_cache else _unpacked_forward, model)
    return lambda: model.__dict__.pop("forward", None)


WATCHED = ("position_ids", "attention_mask")  # either given: the caller's positions may pack
# a class's forward -> WATCHED's positions among its arguments after self (None: keyword only),
# looked up, not computed, in the forward (dynamo traces it: no inspect there)
_WATCHED_AT: dict[Any, tuple[tuple[str, int | None], ...]] = {}


def _uncached_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    if self.training and "use_cache" not in kwargs:
        kwargs["use_cache"] = False
    return _unpacked_forward(self, *args, **kwargs)


def _unpacked_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward = type(self).forward
    for name, at in _WATCHED_AT[forward]:
        given = kwargs.get(name)
        if given is None and at is not None and at < len(args):
            given = args[at]
        if given is not None:
            return forward(self, *args, **kwargs)
    with _one_sequence_a_row():
        return forward(self, *args, **kwargs)


@contextmanager
def _one_sequence_a_row():
    mu = _masking_utils()
    saved = getattr(mu, PACKED_CHECK, None)
    if saved is None:
        yield
        return
    setattr(mu, PACKED_CHECK, _unpacked)
    try:
        yield
    finally:
        setattr(mu, PACKED_CHECK, saved)


def _unpacked(position_ids: Any, *args: Any, **kwargs: Any) -> None:
    return None


def _sdpa_mask_or_none(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Any = None,
    attention_mask: Any = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs: Any,
) -> Any:
    """transformers' SDPA mask, or None where its eager path skips it: no padding mask, no
    sliding window reached, and the caller allows the skip (a bidirectional mask; a causal mask
    SDPA's top-left `is_causal` gives: one query, as many queries as keys, or an empty cache)."""
    if attention_mask is None and (local_size is None or kv_length < local_size):
        if allow_is_bidirectional_skip:
            return None
        first = isinstance(q_offset, int) and q_offset == 0
        if allow_is_causal_skip and (q_length == 1 or kv_length == q_length or first):
            return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
        local_size=local_size, allow_is_causal_skip=allow_is_causal_skip,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip, **kwargs,
    )  # fmt: skip


@functools.cache
def register_implementation() -> str:
    """Register `IMPLEMENTATION` with transformers (once): its SDPA attention, the mask above."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    AttentionInterface.register(IMPLEMENTATION, ALL_ATTENTION_FUNCTIONS["sdpa"])
    AttentionMaskInterface.register(IMPLEMENTATION, _sdpa_mask_or_none)
    return IMPLEMENTATION


def set_implementation(model: nn.Module, name: str) -> None:
    """Switch the model's attention implementation (every sub-config), as transformers does."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(name)
    else:  # older releases: the config attribute is what the attention layers read
        model.config._attn_implementation = name


SKIP_CHECKS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")


@dataclass
class MaskChecks:
    """What `meta_padding_masks` saw: how many times transformers checked position ids for
    packed sequences (a model run with no cache and no padding mask)."""

    packing: int = 0


@contextmanager
def meta_padding_masks(model: nn.Module) -> Iterator[MaskChecks]:
    """For the length of the block, transformers' checks of values a trace on the meta device
    does not have read the inputs as gpushape's default inputs are:
    - whether a padding mask is all true (to pass SDPA no mask): a mask on meta is taken as
      none. The masks models build themselves when given none are all true (BART's and
      Megatron-BERT's: their check had stopped a trace on meta).
    - whether position ids pack several sequences into a row (a model run with no cache and
      no padding mask, `use_cache=False` in training): position ids on meta are one sequence
      a row, as a model's own `arange` makes them. transformers' check still runs, so its ops
      are traced; only its last step, a host sync on the answer, is left out.
    Inputs with values are checked as before. Yields the `MaskChecks` seen."""
    seen = MaskChecks()
    mu = _masking_utils() if is_hf_model(model) else None
    names = (*SKIP_CHECKS, PACKED_CHECK)
    saved = {name: getattr(mu, name, None) for name in names} if mu is not None else {}
    for name, check in saved.items():
        if check is not None:
            wrap = (
                _meta_as_unpacked(check, seen) if name == PACKED_CHECK else _unknown_as_none(check)
            )
            setattr(mu, name, wrap)
    try:
        yield seen
    finally:
        for name, check in saved.items():
            if check is not None:
                setattr(mu, name, check)


def _unknown_as_none(check: Any) -> Any:
    @functools.wraps(check)
    def wrapped(padding_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(padding_mask, "is_meta", False):
            padding_mask = None
        return check(padding_mask, *args, **kwargs)

    return wrapped


def _meta_as_unpacked(find: Any, seen: MaskChecks) -> Any:
    @functools.wraps(find)
    def wrapped(position_ids: Any, *args: Any, **kwargs: Any) -> Any:
        seen.packing += 1
        if not getattr(position_ids, "is_meta", False):
            return find(position_ids, *args, **kwargs)
        with _tracing(_masking_utils()):  # the packing computed as under compile, unchecked
            find(position_ids, *args, **kwargs)
        return None

    return wrapped
