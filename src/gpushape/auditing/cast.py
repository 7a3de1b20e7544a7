"""Audit a model in another dtype without touching it: a meta copy with cast stand-ins.

`copy.deepcopy` is given a memo that maps every parameter and buffer to a meta tensor of the
same shape and strides (floating ones in the new dtype), so the copy shares no storage with
the original and allocates nothing, whatever the model's size or device.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..tracing.inputs import TensorSpec


def _stand_in(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    new_dtype = dtype if t.is_floating_point() else t.dtype
    meta = torch.empty_strided(t.shape, t.stride(), dtype=new_dtype, device="meta")
    if isinstance(t, nn.Parameter):
        return nn.Parameter(meta, requires_grad=t.requires_grad)
    return meta


def needs_cast(model: nn.Module, dtype: torch.dtype) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return any(t.is_floating_point() and t.dtype != dtype for t in tensors)


def model_as(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model` itself when its floating tensors are in `dtype`; else a meta copy in `dtype`."""
    if not needs_cast(model, dtype):
        return model
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        memo.setdefault(id(t), _stand_in(t, dtype))
    return copy.deepcopy(model, memo)


def inputs_as(example_inputs: Any, dtype: torch.dtype) -> Any:
    """Floating-point example inputs (tensors or TensorSpecs) in `dtype`, as meta tensors."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return torch.empty_strided(value.shape, value.stride(), dtype=dtype, device="meta")
        if isinstance(value, TensorSpec) and value.dtype.is_floating_point:
            return TensorSpec(value.shape, dtype, value.channels_last)
        return value

    return pytree.tree_map(cast, example_inputs)
