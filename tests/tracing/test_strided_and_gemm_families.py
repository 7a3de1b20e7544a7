"""Two families that refine the copy rate once measured: pointwise ops on an operand laid out
unlike their output (TensorIterator's indexed kernel: layout.strided_operand), and memory-bound
matrix products. Unmeasured, each prices as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _trace_helpers import meta, only, trace_fn

from gpushape.hardware import get_gpu
from gpushape.tracing.cost import op_cost
from gpushape.tracing.families import memory_family, op_family

H200 = get_gpu("h200")


def _with(**families):
    return H200.replace(achievable=dataclasses.replace(H200.achievable, memory_efficiency=families))


def _mul(a, b):
    return only(trace_fn(lambda x, y: x * y, (a, b)), "mul")


@pytest.mark.parametrize(
    ("a", "b", "family"),
    [
        (meta(64, 56, 56, 96), meta(64, 1, 1, 1), "elementwise_strided"),  # DropPath's mask
        (meta(64, 96, 56, 56), meta(1, 96, 1, 1), "elementwise_strided"),  # a layer scale
        (meta(512, 768), meta(768), "elementwise_strided"),  # a bias over rows
        (meta(64, 768).t(), meta(768, 64), "elementwise_strided"),  # a transposed view
        (meta(512, 768), meta(512, 768), "elementwise"),
        (meta(512, 768), meta(1), "elementwise"),  # one element: a scalar
        (
            meta(8, 96, 14, 14).contiguous(memory_format=torch.channels_last),
            meta(8, 96, 14, 14).contiguous(memory_format=torch.channels_last),
            "elementwise",  # both channels_last: laid out alike
        ),
    ],
)
def test_a_pointwise_op_is_strided_when_an_operand_is_laid_out_unlike_its_output(a, b, family):
    assert memory_family(_mul(a, b)) == family


def test_a_strided_op_prices_as_elementwise_until_measured():
    rec = _mul(meta(64, 56, 56, 96), meta(64, 1, 1, 1))
    assert op_family(rec, {"elementwise": 0.86}) == "elementwise"
    plain = op_cost(rec, _with(elementwise=0.86)).memory_s
    measured = op_cost(rec, _with(elementwise=0.86, elementwise_strided=0.43)).memory_s
    assert measured == pytest.approx(2 * plain)


def test_activations_keep_their_family_on_strided_inputs():
    rec = only(trace_fn(lambda x: torch.nn.functional.gelu(x), (meta(64, 768).t(),)), "gelu")
    assert memory_family(rec) == "activation"


def test_a_matrix_product_is_a_gemm_priced_at_the_copy_rate_until_measured():
    a, b = meta(200704, 96, dtype=torch.bfloat16), meta(96, 384, dtype=torch.bfloat16)
    narrow = only(trace_fn(lambda x, y: x @ y, (a, b)), "mm")  # memory-bound
    assert memory_family(narrow) == "gemm"
    base = op_cost(narrow, H200)
    assert base.memory_s > base.compute_s
    assert op_cost(narrow, _with(gemm=0.5)).kernel_time_s == pytest.approx(2 * base.memory_s)


def test_a_compute_bound_product_ignores_the_gemm_memory_rate():
    a, b = meta(4096, 4096, dtype=torch.bfloat16), meta(4096, 4096, dtype=torch.bfloat16)
    square = only(trace_fn(lambda x, y: x @ y, (a, b)), "mm")
    base = op_cost(square, H200)
    assert base.bound == "compute"
    assert op_cost(square, _with(gemm=0.5)).kernel_time_s == base.kernel_time_s
