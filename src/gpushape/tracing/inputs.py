"""Example inputs and parameters, made to live where the trace runs.

On the meta device (the default) a tensor is only a shape, a dtype and strides: real tensors
given as example inputs are replaced by meta tensors of the same layout, and a model whose
weights are real is called with meta stand-ins for its parameters and buffers (through
`torch.func.functional_call`), so tracing never copies a weight and never computes. On a real
device ("cpu", "cuda") meta inputs are filled with random values (floats from N(0, 1), integers
and booleans with zeros: a valid token id, index or mask everywhere).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class TensorSpec:
    """An input by shape and dtype alone: `TensorSpec((8, 3, 224, 224), torch.bfloat16)`."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    channels_last: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))


def split_inputs(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) the model is called with: a dict is keyword arguments, a tuple or list
    positional arguments, anything else the one positional argument."""
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def _layout(shape: Sequence[int], channels_last: bool) -> torch.memory_format:
    if channels_last and len(shape) == 4:
        return torch.channels_last
    if channels_last and len(shape) == 5:
        return torch.channels_last_3d
    return torch.contiguous_format


def _fill(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.normal_()
    return t.zero_()


def place(value: Any, device: torch.device) -> Any:
    """`value` (a tensor, a TensorSpec, or containers of them) on `device`; others unchanged."""
    if isinstance(value, TensorSpec):
        t = torch.empty(
            value.shape,
            dtype=value.dtype,
            device=device,
            memory_format=_layout(value.shape, value.channels_last),
        )
        return t if device.type == "meta" else _fill(t)
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if device.type == "meta" or value.device.type == "meta":
            t = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
            return t if device.type == "meta" else _fill(t)
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(place(v, device) for v in value)
    if isinstance(value, Mapping):
        return {k: place(v, device) for k, v in value.items()}
    return value


def model_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def model_device_types(model: nn.Module) -> set[str]:
    return {t.device.type for _, t in model_tensors(model)}


def meta_stand_ins(model: nn.Module) -> dict[str, torch.Tensor]:
    """A meta tensor of the same shape, dtype and strides for every parameter and buffer.

    Parameters stay `nn.Parameter`s (with their `requires_grad`), so a backward pass reaches
    them as leaves, as it reaches the real ones. Tied weights appear once (named_parameters
    drops duplicates) and `functional_call(..., tie_weights=True)` ties them again.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in model_tensors(model):
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        out[name] = (
            nn.Parameter(meta, requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter)
            else meta
        )
    return out
