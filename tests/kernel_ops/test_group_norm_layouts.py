"""group_norm_act / GroupNormAct in each layout and on strided tensors (CPU lane): y and dx
keep x's layout, and strided inputs, grad_outputs and parameters give the contiguous ones' result.

TRITON_INTERPRET=1 runs the Triton kernels on small shapes (the `interpret` fixture). Values and
shapes: test_group_norm.py. GPU lane: test_group_norm_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from ._group_norm_cases import CL, LAYOUTS, assert_equal, fresh, gn, make_case, run_grads


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---- layouts and strides --------------------------------------------------------------------
def test_keeps_layout(interpret):
    """Contiguous x -> contiguous y and dx; 4-D channels_last -> channels_last; other strides
    -> contiguous."""
    cases = {
        "nchw": (make_case((2, 4, 3, 5), torch.float32, "nchw")[0], torch.contiguous_format),
        "nchw-cl": (make_case((2, 4, 3, 5), torch.float32, "nchw-cl")[0], CL),
        "ncl": (make_case((2, 4, 15), torch.float32, "ncl")[0], torch.contiguous_format),
        "transposed": (
            torch.randn(2, 4, 5, 3).transpose(2, 3).requires_grad_(),
            torch.contiguous_format,
        ),
        "ncl-channels-fastest": (
            torch.randn(2, 15, 4).transpose(1, 2).requires_grad_(),
            torch.contiguous_format,
        ),
    }
    for name, (x, fmt) in cases.items():
        w, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
        y, dx, _, _ = run_grads(gn(2, activation="silu"), (x, w, b), torch.randn(x.shape))
        assert y.is_contiguous(memory_format=fmt), name
        assert dx.is_contiguous(memory_format=fmt), name
        if name in ("nchw", "nchw-cl", "ncl"):
            assert y.stride() == x.stride() and dx.stride() == x.stride(), name


def test_strided_inputs_equal_contiguous(interpret):
    """Sliced, permuted, offset, odd-strided and expanded inputs are copied contiguous first:
    the contiguous input's y and gradients bit for bit."""
    base = torch.randn(3, 8, 6, 10)
    views = {
        "sliced_c": base[:, ::2],
        "sliced_last": base[..., ::2],
        "transposed_hw": base.transpose(2, 3),
        "offset": base[1:, 2:6, 1:],
        "odd_strides": torch.randn(300).as_strided((2, 4, 3, 5), (101, 23, 7, 1), 4),
        "expanded_batch": base[:1].expand(3, 8, 6, 10),
        "ncl_transposed": torch.randn(2, 7, 8).transpose(1, 2),
    }
    for name, xv in views.items():
        c = xv.shape[1]
        w, b = torch.randn(c), torch.randn(c)
        dy = torch.randn(xv.shape)
        args = (xv.detach().requires_grad_(), *fresh(w, b))
        got = run_grads(gn(2, activation="gelu"), args, dy)
        dense = (xv.contiguous().detach().requires_grad_(), *fresh(w, b))
        want = run_grads(gn(2, activation="gelu"), dense, dy)
        assert_equal(got, want)
        assert got[0].is_contiguous() and got[1].is_contiguous(), name


def test_channels_last_equals_nchw(interpret):
    x, w, b = make_case((2, 6, 5, 7), torch.float32, "nchw")
    dy = torch.randn(x.shape)
    want = run_grads(gn(3, activation="relu"), fresh(x, w, b), dy)
    xc, wc, bc = fresh(x, w, b)
    got = run_grads(gn(3, activation="relu"), (xc.contiguous(memory_format=CL), wc, bc), dy)
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_grad_output_layouts(interpret):
    """An expanded (stride-0) grad_output and one in the other layout than x give the result
    of a dense grad_output in x's layout, bit for bit."""
    for layout in ("nchw", "nchw-cl"):
        x, w, b = make_case((2, 6, 3, 4), torch.float32, layout)
        small = torch.randn(1, 6, 1, 1)
        fmt = LAYOUTS[layout][1]
        dense_dy = small.expand(x.shape).contiguous(memory_format=fmt)
        want = run_grads(gn(3, activation="silu"), fresh(x, w, b), dense_dy)
        got = run_grads(gn(3, activation="silu"), fresh(x, w, b), small.expand(x.shape))
        assert_equal(got, want)
        other = CL if fmt == torch.contiguous_format else torch.contiguous_format
        got = run_grads(
            gn(3, activation="silu"), fresh(x, w, b), dense_dy.contiguous(memory_format=other)
        )
        assert_equal(got, want)


def test_strided_parameters(interpret):
    x = make_case((2, 6, 3, 4), torch.float32, "nchw")[0]
    dy = torch.randn(x.shape)
    wide = torch.randn(12, 2)
    ws, bs = wide[::2, 0].detach().requires_grad_(), wide[1::2, 1].detach().requires_grad_()
    got = run_grads(gn(3, activation="gelu"), (x, ws, bs), dy)
    want = run_grads(gn(3, activation="gelu"), (x, *fresh(ws, bs)), dy)
    assert_equal(got, want)
