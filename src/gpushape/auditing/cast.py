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


def channels_last_as(model: nn.Module, example_inputs: Any) -> tuple[nn.Module, Any]:
    """A meta copy of `model` with its 4-D weights channels_last, and the 4-D floating inputs
    channels_last (meta tensors or TensorSpecs): the model as Inductor's layout optimization
    runs it. The model itself is not touched."""

    def nhwc(t: torch.Tensor) -> torch.Tensor:
        meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
        if t.dim() == 4:
            meta = meta.contiguous(memory_format=torch.channels_last)
        if isinstance(t, nn.Parameter):
            return nn.Parameter(meta, requires_grad=t.requires_grad)
        return meta

    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        memo.setdefault(id(t), nhwc(t))

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 4:
            return nhwc(value)
        if (
            isinstance(value, TensorSpec)
            and value.dtype.is_floating_point
            and len(value.shape) == 4
        ):
            return TensorSpec(value.shape, value.dtype, channels_last=True)
        return value

    return copy.deepcopy(model, memo), pytree.tree_map(convert, example_inputs)
