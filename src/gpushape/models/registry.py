"""The model zoo's registry: factories registered by name with `@register_model`.

Every factory has the signature
`factory(batch=None, dtype=torch.bfloat16, device="meta", **options) -> (model, example_inputs)`
where `example_inputs` is a tuple of tensors the model is called with (`model(*example_inputs)`).
Float parameters and float inputs are in `dtype`; token ids are int64. The model comes back in
training mode, as `nn.Module` is built; call `.eval()` for inference.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError

ModelAndInputs = tuple[nn.Module, tuple[torch.Tensor, ...]]
ModelFactory = Callable[..., ModelAndInputs]


class UnknownModelError(GpushapeError, LookupError):
    """A model name that is not in the zoo."""


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    name: str
    default_batch: int
    description: str
    factory: ModelFactory = field(repr=False, compare=False)


_REGISTRY: dict[str, ModelEntry] = {}


def normalize_model_name(name: str) -> str:
    """'ResNet50' -> 'resnet50', 'vit_b16' -> 'vit-b16', ' BERT base ' -> 'bert-base'."""
    return re.sub(r"[\s_]+", "-", str(name).strip().lower())


def check_batch(batch: Any) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise GpushapeError(f"batch must be a positive integer, got {batch!r}")
    return batch


def check_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise GpushapeError(
            f"dtype must be a floating-point torch.dtype (e.g. torch.bfloat16), got {dtype!r}"
        )
    return dtype


def register_model(
    name: str, *, default_batch: int, description: str
) -> Callable[[Callable[..., ModelAndInputs]], ModelFactory]:
    """Register `fn(*, batch: int, dtype, device: torch.device, **options)` under `name`.

    The returned factory fills in the default batch, checks batch and dtype, and turns the
    device into a `torch.device` before calling `fn`.
    """
    key = normalize_model_name(name)
    check_batch(default_batch)

    def decorate(fn: Callable[..., ModelAndInputs]) -> ModelFactory:
        @functools.wraps(fn)
        def factory(
            batch: int | None = None,
            dtype: torch.dtype = torch.bfloat16,
            device: str | torch.device = "meta",
            **options: Any,
        ) -> ModelAndInputs:
            batch = default_batch if batch is None else check_batch(batch)
            dtype = check_dtype(dtype)
            return fn(batch=batch, dtype=dtype, device=torch.device(device), **options)

        factory.__signature__ = _public_signature(fn)  # type: ignore[attr-defined]
        if key in _REGISTRY:
            raise ValueError(f"model {key!r} is registered twice")
        _REGISTRY[key] = ModelEntry(
            name=key, default_batch=default_batch, description=description, factory=factory
        )
        return factory

    return decorate


def _public_signature(fn: Callable[..., ModelAndInputs]) -> inspect.Signature:
    """`(batch=None, dtype=torch.bfloat16, device='meta', *, <fn's own options>)`: what callers
    (and `resolve_model`, which passes only the arguments a factory names) should see."""
    kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    placed = [
        inspect.Parameter("batch", kw, default=None),
        inspect.Parameter("dtype", kw, default=torch.bfloat16),
        inspect.Parameter("device", kw, default="meta"),
    ]
    own = [
        p
        for name, p in inspect.signature(fn).parameters.items()
        if name not in ("batch", "dtype", "device")
    ]
    return inspect.Signature([*placed, *own], return_annotation=ModelAndInputs)


def list_models() -> list[ModelEntry]:
    """Every registered model, sorted by name."""
    return [_REGISTRY[key] for key in sorted(_REGISTRY)]


def known_model_names() -> list[str]:
    return sorted(_REGISTRY)


def get_model_entry(name: str) -> ModelEntry:
    """The registry entry for `name` (case-insensitive; '_' and ' ' read as '-')."""
    key = normalize_model_name(name)
    entry = _REGISTRY.get(key)
    if entry is None:
        near = difflib.get_close_matches(key, _REGISTRY.keys(), n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UnknownModelError(
            f"unknown model {name!r}{hint}; known: {', '.join(known_model_names())}"
        )
    return entry


def create_model(
    name: str,
    batch: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "meta",
    **options: Any,
) -> ModelAndInputs:
    """Build zoo model `name`: `(model, example_inputs)`. Options are the model's config fields
    (e.g. `layers=2`), `config=` a whole config, and input shape (`seq_len=`, `image_size=`)."""
    return get_model_entry(name).factory(batch=batch, dtype=dtype, device=device, **options)
