"""`--input` strings: `8x3x224x224[:bf16]` -> ((8, 3, 224, 224), torch.bfloat16), and tensors."""

from __future__ import annotations

import re

import torch

from ..errors import GpushapeError

DTYPE_NAMES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp64": torch.float64,
    "float64": torch.float64,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
INPUT_FORM = "SHAPE[:DTYPE], e.g. 8x3x224x224 or 8x512:int64"
_SHAPE = re.compile(r"\d+(x\d+)*")


def parse_input_spec(
    spec: str, default_dtype: torch.dtype = torch.bfloat16
) -> tuple[tuple[int, ...], torch.dtype]:
    """'8x3x224x224:bf16' -> ((8, 3, 224, 224), torch.bfloat16); no suffix -> default_dtype.

    Dimensions are positive integers joined by 'x'; dtypes: fp32, fp16, bf16, fp64 (or their
    torch names), int64/long, int32, bool. Case and surrounding spaces are ignored.
    """
    shape_text, colon, dtype_text = (part.strip() for part in str(spec).lower().partition(":"))
    if not _SHAPE.fullmatch(shape_text) or (colon and not dtype_text):
        raise GpushapeError(f"bad --input {spec!r}: expected {INPUT_FORM}")
    shape = tuple(int(dim) for dim in shape_text.split("x"))
    if 0 in shape:
        raise GpushapeError(f"bad --input {spec!r}: every dimension must be at least 1")
    if not colon:
        return shape, default_dtype
    if dtype_text not in DTYPE_NAMES:
        raise GpushapeError(
            f"bad --input {spec!r}: unknown dtype {dtype_text!r}; expected {INPUT_FORM} with "
            f"DTYPE one of fp32, fp16, bf16, fp64, int64 (long), int32, bool"
        )
    return shape, DTYPE_NAMES[dtype_text]


def make_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor to call a model with: N(0, 1) floats, zero integers (a valid index for any
    embedding), all-True booleans (an attention mask that masks nothing); uninitialised on meta."""
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=device)
    return torch.zeros(shape, dtype=dtype, device=device)


def inputs_from_specs(
    specs: list[str], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """One tensor per `--input` string, floats defaulting to `dtype`."""
    return tuple(make_input(*parse_input_spec(spec, dtype), device) for spec in specs)
