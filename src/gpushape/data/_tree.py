"""Batches as nested structures: tensors mapped or visited through tuples, lists and dicts.

A batch from a DataLoader is a tensor or any nesting of tuples (named tuples included), lists
and mappings around tensors; anything else (strings, numbers, None, file names) is a leaf that
passes through untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


def map_tensors(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """`batch` with every tensor replaced by `fn(tensor)`, the structure and other leaves kept."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple):
        items = [map_tensors(fn, item) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else tuple(items)
    if isinstance(batch, list):
        return [map_tensors(fn, item) for item in batch]
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {k: map_tensors(fn, v) for k, v in batch.items()})
    return batch


def _rebuild_mapping(original: Mapping, values: dict) -> Mapping:
    """The mapping's own type (OrderedDict, defaultdict, ...) where it can be copied, else dict."""
    if type(original) is dict:
        return values
    try:
        rebuilt = copy.copy(original)
        rebuilt.update(values)  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return values
    return rebuilt


def iter_tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in `batch`, depth first, in the order `map_tensors` visits them."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (tuple, list)):
        for item in batch:
            yield from iter_tensors(item)
    elif isinstance(batch, Mapping):
        for item in batch.values():
            yield from iter_tensors(item)
