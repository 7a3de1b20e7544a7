"""`--input` strings: SHAPE[:DTYPE]."""

from __future__ import annotations

import pytest
import torch

from gpushape.errors import GpushapeError
from gpushape.models import parse_input_spec


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("8x3x224x224", ((8, 3, 224, 224), torch.bfloat16)),
        ("8x3x224x224:bf16", ((8, 3, 224, 224), torch.bfloat16)),
        ("8x512:int64", ((8, 512), torch.int64)),
        ("8x512:long", ((8, 512), torch.int64)),
        ("4x4:int32", ((4, 4), torch.int32)),
        ("2x7:bool", ((2, 7), torch.bool)),
        ("16:fp32", ((16,), torch.float32)),
        ("16:fp16", ((16,), torch.float16)),
        ("16:fp64", ((16,), torch.float64)),
        ("16:float32", ((16,), torch.float32)),
        (" 8X512 : INT64 ", ((8, 512), torch.int64)),
    ],
)
def test_good_forms(spec, expected):
    assert parse_input_spec(spec) == expected


def test_no_suffix_takes_the_default_dtype():
    assert parse_input_spec("2x3", default_dtype=torch.float16) == ((2, 3), torch.float16)


@pytest.mark.parametrize(
    "spec", ["", "x", "8x", "x8", "8xx3", "8x-3", "8x3.5", "8,3", "8*3", "8x3:", ":bf16", "8 x 3"]
)
def test_malformed_shapes_say_the_expected_form(spec):
    with pytest.raises(GpushapeError) as info:
        parse_input_spec(spec)
    assert str(info.value) == (
        f"bad --input {spec!r}: expected SHAPE[:DTYPE], e.g. 8x3x224x224 or 8x512:int64"
    )


def test_zero_dimension_is_refused():
    with pytest.raises(GpushapeError, match="bad --input '8x0': every dimension must be at least"):
        parse_input_spec("8x0")


@pytest.mark.parametrize("spec", ["8x3:float8", "8x3:bf16:x", "8x3:int8"])
def test_unknown_dtype_lists_the_known_ones(spec):
    with pytest.raises(GpushapeError) as info:
        parse_input_spec(spec)
    message = str(info.value)
    assert message.startswith(f"bad --input {spec!r}: unknown dtype ")
    assert "fp32, fp16, bf16, fp64, int64 (long), int32, bool" in message
