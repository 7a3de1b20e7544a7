"""max_pool2d / MaxPool2d against F.max_pool2d (CPU lane).

TRITON_INTERPRET=1 runs the Triton kernels on small shapes (the `interpret` fixture); tests that
pin the plain-PyTorch reference path unset it. GPU lane: test_max_pool_gpu.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.kernels import MaxPool2d, max_pool2d
from gpushape.kernels._plan_cache import PlanCache
from gpushape.kernels.pooling import _launch
from gpushape.kernels.pooling.max_pool import max_pool2d_backward_op, max_pool2d_op

from ._max_pool_cases import (
    CF,
    CL,
    FORMATS,
    POOLS,
    assert_same_layout,
    check_against_torch,
    check_taps,
    make_input,
    pool_id,
    run,
    special_values,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


@pytest.fixture
def reference_path(monkeypatch):
    """CPU tensors on the plain-PyTorch reference (TRITON_INTERPRET unset)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


# ---- against F.max_pool2d, Triton kernels in the interpreter --------------------------------
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("pool", POOLS, ids=pool_id)
def test_matches_torch_float32(interpret, pool, fmt):
    check_against_torch(make_input((2, 5, 9, 11), torch.float32, fmt), pool)


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("pool", [(3, 2, 1), (3, 1, 1), ((3, 2), (2, 1), (1, 0))], ids=pool_id)
def test_matches_torch_16bit(interpret, pool, dtype, fmt):
    check_against_torch(make_input((2, 6, 8, 7), dtype, fmt), pool)


@pytest.mark.parametrize(
    "shape", [(1, 1, 1, 1), (3, 1, 7, 5), (1, 3, 2, 2), (2, 130, 5, 6), (1, 2, 17, 33)]
)
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_odd_shapes(interpret, shape, fmt):
    """Odd H and W, one channel, more channels than a tile spans (130), a single pixel."""
    pool = (1, 1, 0) if shape[-1] == 1 else (3, 2, 1) if min(shape[-2:]) >= 2 else (2, 1, 0)
    check_against_torch(make_input(shape, torch.float32, fmt), pool, gate=False)


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("pool", [(3, 2, 1), (3, 1, 1), (2, 2, 0)], ids=pool_id)
def test_ties_route_like_torch(interpret, pool, dtype, fmt):
    """Integer values -2..2: most windows hold several maxima; the first in row-major order
    takes the gradient, as in PyTorch (checked through the values, the taps and dx)."""
    check_against_torch(make_input((2, 4, 9, 8), dtype, fmt, ties=True), pool, gate=False)


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pool", [(3, 2, 1), (2, 2, 0), (3, 1, 1)], ids=pool_id)
def test_nan_and_inf_like_torch(interpret, pool, dtype, fmt):
    """NaN propagates and takes the gradient (the last NaN of a window, as PyTorch); +-inf
    are ordinary values; a window of -inf only routes its gradient to its first real tap."""
    check_against_torch(special_values((2, 3, 7, 8), dtype, fmt), pool, gate=False)


def test_nan_window_reference_matches_kernel(interpret):
    x = torch.zeros(1, 2, 4, 4)
    x[0, :, 0, 1] = x[0, :, 1, 0] = float("nan")
    check_taps(x, (3, 1, 1))
    _, idx = F.max_pool2d(x, 3, 1, 1, return_indices=True)
    assert idx[0, 0, 0, 0] == 4  # PyTorch keeps the last NaN: (1, 0), flat 1*4 + 0


def test_strided_and_permuted_inputs(interpret):
    """Sliced, permuted and offset inputs give PyTorch's values and output layout."""
    base = torch.randn(2, 8, 9, 14)
    views = {
        "sliced_w": base[..., ::2],
        "sliced_c_of_cl": base.contiguous(memory_format=CL)[:, ::2],
        "permuted": torch.randn(2, 9, 6, 7).permute(0, 2, 1, 3),
        "offset": base[1:, 1:],
    }
    for name, view in views.items():
        y = max_pool2d(view, 3, 2, 1)
        ref = F.max_pool2d(view, 3, 2, 1)
        assert torch.equal(y, ref), name
        assert_same_layout(y, ref, name)


def test_expanded_grad_output(interpret):
    x = make_input((2, 3, 8, 8), torch.float32, CL)
    dy = torch.randn(1, 3, 1, 1).expand(2, 3, 4, 4)
    _, dx = run(lambda t: max_pool2d(t, 3, 2, 1), x, dy)
    _, dx_ref = run(lambda t: F.max_pool2d(t, 3, 2, 1), x, dy)
    assert torch.equal(dx, dx_ref) and dx.is_contiguous(memory_format=CL)


def test_unbatched_input(interpret):
    x = make_input((3, 9, 10), torch.float32, CF)
    check_against_torch(x, (3, 2, 1), gate=False)


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_empty_batch(interpret, fmt):
    x = torch.randn(0, 4, 8, 8).contiguous(memory_format=fmt).requires_grad_()
    y = max_pool2d(x, 3, 2, 1)
    y.backward(torch.randn_like(y))
    assert y.shape == (0, 4, 4, 4) and x.grad.shape == x.shape


def test_inference_matches_training_forward(interpret):
    x = make_input((2, 5, 9, 9), torch.bfloat16, CL)
    with torch.no_grad():
        y_inference = max_pool2d(x, 3, 2, 1)
    assert torch.equal(y_inference, max_pool2d(x, 3, 2, 1).detach())


def test_repeated_backward_is_bitwise_equal(interpret):
    x = make_input((2, 6, 9, 9), torch.bfloat16, CL)
    dy = torch.randn(2, 6, 9, 9).to(torch.bfloat16)
    first = run(lambda t: max_pool2d(t, 3, 1, 1), x, dy)[1]
    for _ in range(2):
        assert torch.equal(first, run(lambda t: max_pool2d(t, 3, 1, 1), x, dy)[1])


def test_int64_index_variant(interpret, monkeypatch):
    """The WIDE kernels (int64 offsets, for tensors past 2^31 elements) on a small tensor."""
    monkeypatch.setattr(_launch, "_INT32_LIMIT", 0)
    monkeypatch.setattr(_launch, "_PLANS", PlanCache(_launch._MAX_PLANS))
    for fmt in (CL, CF):
        check_against_torch(make_input((2, 3, 7, 9), torch.float32, fmt), (3, 2, 1), gate=False)


def test_kernels_compile_for_sm90():
    # The interpreter checks what the kernels compute; this compiles the launchers' launch
    # configurations with ptxas for sm_90, so a GPU-only codegen error fails CI too. A
    # subprocess, since TRITON_INTERPRET=1 replaces the kernels here.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_max_pool_compile_check.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kernel configurations for sm_90" in done.stdout


# ---- gradcheck ------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_gradcheck_float64_reference(reference_path, fmt):
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64).contiguous(memory_format=fmt)
    for pool in ((3, 2, 1), ((2, 3), (1, 2), (1, 1))):
        assert torch.autograd.gradcheck(
            lambda t, pool=pool: max_pool2d(t, *pool), (x.requires_grad_(),)
        )


def test_gradcheck_float64_triton(interpret):
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64).contiguous(memory_format=CL)
    assert torch.autograd.gradcheck(
        lambda t: max_pool2d(t, 3, 2, 1), (x.requires_grad_(),), fast_mode=True
    )


def test_reference_path_matches_torch(reference_path):
    for fmt in (CL, CF):
        check_against_torch(make_input((2, 5, 9, 7), torch.bfloat16, fmt, ties=True), (3, 2, 1))


# ---- module ---------------------------------------------------------------------------------
def test_module_from_torch_repr_and_state_dict(interpret):
    stock = nn.MaxPool2d(3, 2, 1)
    ours = MaxPool2d.from_torch(stock)
    expected = "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)"
    assert repr(ours) == repr(stock) == expected
    assert ours.state_dict() == {} and list(ours.parameters()) == []
    assert (ours.kernel_size, ours.stride, ours.padding) == (3, 2, 1)
    assert MaxPool2d((2, 3)).stride == (2, 3) == nn.MaxPool2d((2, 3)).stride
    x = make_input((2, 4, 10, 9), torch.float32, CL)
    assert torch.equal(ours(x), stock(x))


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(dilation=2), "dilation=2 is not supported"),
        (dict(ceil_mode=True), "ceil_mode=True is not supported"),
        (dict(return_indices=True), "return_indices=True is not supported"),
        (dict(padding=2), r"padding must be at most half the kernel size"),
        (dict(kernel_size=12), "144 taps, more than the 127"),
    ],
)
def test_module_refuses_unsupported_settings(settings, message):
    args = dict(kernel_size=3, stride=2, padding=1) | settings
    with pytest.raises(ValueError, match=message):
        MaxPool2d(**args)
    with pytest.raises(ValueError, match=message):
        MaxPool2d.from_torch(nn.MaxPool2d(**args))


def test_from_torch_needs_a_max_pool():
    with pytest.raises(TypeError, match=r"expected nn\.MaxPool2d, got AvgPool2d"):
        MaxPool2d.from_torch(nn.AvgPool2d(2))


@pytest.mark.parametrize(
    "x,args,error,message",
    [
        (torch.ones(1, 2, 4, 4, dtype=torch.int64), (2,), TypeError, "x must be float32"),
        (torch.ones(1, 2, 4, 4, dtype=torch.bool), (2,), TypeError, "x must be float32"),
        ([[1.0]], (2,), TypeError, "x must be a torch.Tensor, got list"),
        (torch.ones(4, 4), (2,), ValueError, r"expected a 4-D .* got 2-D of shape \(4, 4\)"),
        (torch.ones(1, 1, 2, 4, 4), (2,), ValueError, "got 5-D"),
        (torch.ones(1, 0, 4, 4), (2,), ValueError, "C, H and W must be non-zero"),
        (torch.ones(1, 2, 2, 2), (3,), ValueError, "smaller than the 3x3 window"),
        (torch.ones(1, 2, 4, 4), (0,), ValueError, "kernel_size must be positive"),
        (torch.ones(1, 2, 4, 4), (2.5,), TypeError, "kernel_size must be an int or a pair"),
        (torch.ones(1, 2, 4, 4), ((1, 2, 3),), TypeError, "kernel_size must be an int or a pair"),
        (torch.ones(1, 2, 4, 4), (2, 0), ValueError, "stride must be positive"),
        (torch.ones(1, 2, 4, 4), (2, 1, -1), ValueError, "padding must be >= 0"),
    ],
)
def test_bad_input_raises_clear_error(x, args, error, message):
    with pytest.raises(error, match=message):
        max_pool2d(x, *args)


def test_functional_signature_matches_torch(interpret):
    x = make_input((1, 2, 6, 6), torch.float32, CF)
    assert torch.equal(max_pool2d(x, 2, [], 0, 1, False, False), F.max_pool2d(x, 2))
    with pytest.raises(ValueError, match="dilation"):
        max_pool2d(x, 2, dilation=(1, 2))


# ---- meta tensors, custom ops, torch.compile ------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_meta_shapes_and_strides(fmt):
    x = torch.empty(8, 64, 112, 112, device="meta", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=fmt).requires_grad_()
    y = max_pool2d(x, 3, 2, 1)
    ref = F.max_pool2d(x.detach(), 3, 2, 1)
    assert y.device.type == "meta" and y.shape == ref.shape and y.stride() == ref.stride()
    y.backward(torch.empty_like(y))
    assert x.grad.shape == x.shape and x.grad.stride() == x.stride()
    y2, taps = max_pool2d_op(x.detach(), [3, 3], [2, 2], [1, 1])
    assert taps.dtype == torch.int8 and taps.stride() == ref.stride()
    dx = max_pool2d_backward_op(y2, taps, [112, 112], [3, 3], [2, 2], [1, 1], fmt == CL)
    assert dx.stride() == x.stride()


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_opcheck(interpret, fmt):
    x = make_input((2, 3, 7, 6), torch.float32, fmt)
    torch.library.opcheck(max_pool2d_op, (x, [3, 3], [2, 2], [1, 1]))
    _, taps = max_pool2d_op(x.detach(), [3, 3], [2, 2], [1, 1])
    dy = torch.randn(2, 3, 4, 3).contiguous(memory_format=fmt)
    args = (dy, taps, [7, 6], [3, 3], [2, 2], [1, 1], fmt == CL)
    torch.library.opcheck(max_pool2d_backward_op, args)


def test_torch_compile_fullgraph_reference(reference_path):
    """torch.compile(fullgraph=True) traces the custom ops (CPU reference at run time) and
    matches eager, forward and dx. AOTAutograd's disk cache is off (see _batch_norm_cases)."""
    torch._dynamo.reset()
    module = MaxPool2d(3, 2, 1)
    compiled = torch.compile(module, fullgraph=True)
    x = make_input((2, 4, 9, 9), torch.float32, CL)
    dy = torch.randn(2, 4, 5, 5)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        y, dx = run(compiled, x, dy)
    y_ref, dx_ref = run(lambda t: F.max_pool2d(t, 3, 2, 1), x, dy)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    assert_same_layout(dx, dx_ref, "dx")


def test_torch_func_takes_torch_op(reference_path):
    x = torch.randn(2, 3, 6, 6)
    grad = torch.func.grad(lambda t: max_pool2d(t, 2).sum())(x)
    assert torch.equal(grad, torch.func.grad(lambda t: F.max_pool2d(t, 2).sum())(x))


def test_check_helpers_cover_both_layouts():
    """The cases module's layout check itself: it tells NCHW from channels_last."""
    a = torch.randn(2, 3, 4, 5)
    with pytest.raises(AssertionError):
        assert_same_layout(a, a.contiguous(memory_format=CL), "probe")
    assert_same_layout(a, a.clone(memory_format=CF), "probe")
