"""Helpers every zoo factory shares: configuration overrides, building on a device, inputs.

A model is built inside a `torch.device(...)` context, so on the meta device no parameter memory
is ever allocated (a 7B model costs nothing), and on a real device parameters are created there
directly. Weights are initialised in float32 and cast to the requested dtype last, which is how
training code usually does it; on the meta device initialisation is skipped (there are no values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from ..errors import GpushapeError

ConfigT = TypeVar("ConfigT")


def configure(model_name: str, base: ConfigT, options: Mapping[str, Any]) -> ConfigT:
    """`base` with the fields named in `options` replaced; `options["config"]` replaces `base`.

    Unknown option names are an error that lists the valid ones.
    """
    options = dict(options)
    config = options.pop("config", None) or base
    if not isinstance(config, type(base)):
        raise GpushapeError(
            f"{model_name}: config must be a {type(base).__name__}, got {type(config).__name__}"
        )
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise GpushapeError(
            f"{model_name}: unknown option {unknown[0]!r}; options: "
            f"{', '.join(sorted(fields | {'config'}))}"
        )
    return dataclasses.replace(config, **options)


def check_divides(model_name: str, hidden: int, heads: int) -> None:
    if heads < 1 or hidden % heads:
        raise GpushapeError(
            f"{model_name}: {heads} heads do not divide the width {hidden}; pick heads | hidden"
        )


def check_seq_len(model_name: str, seq_len: int, max_seq_len: int) -> int:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= max_seq_len:
        raise GpushapeError(
            f"{model_name}: seq_len must be an integer in 1..{max_seq_len}, got {seq_len!r}"
        )
    return seq_len


def build(
    make: Callable[[], nn.Module],
    *,
    dtype: torch.dtype,
    device: torch.device,
    init: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """`make()` run on `device`, initialised by `init` (skipped on meta), then cast to `dtype`.

    `.to(dtype=...)` casts only floating-point parameters and buffers (BatchNorm's integer
    `num_batches_tracked` stays int64) and keeps tied weights tied.
    """
    with torch.device(device):
        model = make()
        if init is not None and device.type != "meta":
            with torch.no_grad():
                init(model)
    return model.to(dtype=dtype)


def float_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A standard-normal tensor (values are irrelevant on meta, so none are made there)."""
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device)


def token_input(shape: tuple[int, ...], vocab_size: int, device: torch.device) -> torch.Tensor:
    """int64 token ids drawn uniformly from the vocabulary."""
    if device.type == "meta":
        return torch.empty(shape, dtype=torch.int64, device=device)
    return torch.randint(0, vocab_size, shape, dtype=torch.int64, device=device)


def init_normal_(module: nn.Module, std: float = 0.02) -> None:
    """The usual transformer init: Linear/Embedding weights N(0, std), zero biases, norms 1/0."""
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            nn.init.normal_(sub.weight, mean=0.0, std=std)
        if isinstance(sub, nn.Linear) and sub.bias is not None:
            nn.init.zeros_(sub.bias)
        if isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)
