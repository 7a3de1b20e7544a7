"""global_response_norm / GlobalResponseNorm against timm's composition (CPU lane).

TRITON_INTERPRET=1 runs the Triton kernels on small shapes (the `interpret` fixture); tests that
pin the plain-PyTorch reference path unset it. GPU lane: test_grn_gpu.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from gpushape.kernels import GlobalResponseNorm, global_response_norm
from gpushape.kernels.grn import _launch
from gpushape.kernels.grn.grn import grn_op

from ._grn_cases import LAYOUTS, gate, make_case, torch_grn
from ._numeric import outputs_and_grads

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def reference_path(monkeypatch):
    """CPU tensors on the plain-PyTorch reference (TRITON_INTERPRET unset)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


# ---- the numeric gate, Triton kernels in the interpreter ------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_gate(interpret, dtype, layout):
    x, w, b = make_case(2, 5, 7, 20, dtype, layout)
    gate(x, w, b, LAYOUTS[layout][0])


@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1, 1),
        (3, 1, 1, 5),
        (1, 2, 3, 63),
        (2, 3, 3, 64),
        (1, 4, 2, 65),
        (2, 2, 3, 130),
        (1, 17, 19, 3),
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_odd_shapes(interpret, shape, layout):
    """One pixel, one channel, channel counts around the tiles' widths, many pixels and few
    channels (the pixels split over several programs: see test_pixel_slices)."""
    gate(*make_case(*shape, torch.float32, layout), LAYOUTS[layout][0])


def test_pixel_slices(interpret):
    """Few samples and channels: the sums split the pixels over programs, each writing its
    own partial sums, added in order."""
    x, w, b = make_case(1, 30, 30, 20, torch.float32, "nhwc")
    v = _launch.view(x.detach(), True)
    assert _launch.plan(False, v, x.dtype, x.device).splits > 1
    assert _launch.plan(True, v, x.dtype, x.device).splits > 1
    gate(x, w, b, True)


def test_many_samples(interpret):
    """More samples than the parameter-gradient kernel sums a step (64)."""
    gate(*make_case(70, 2, 3, 5, torch.float32, "nhwc"), True)


def test_gradcheck_float64(interpret):
    for layout in LAYOUTS:
        x, w, b = make_case(2, 3, 4, 6, torch.float64, layout)
        cl = LAYOUTS[layout][0]
        assert torch.autograd.gradcheck(
            lambda x, w, b, cl=cl: global_response_norm(x, w, b, 1e-6, cl), (x, w, b)
        ), layout


@pytest.mark.parametrize("eps", [0.0, 1e-3, 0.5])
def test_eps(interpret, eps):
    gate(*make_case(2, 3, 4, 9, torch.float32, "nhwc"), True, eps=eps)


# ---- layouts and strides --------------------------------------------------------------------
def test_keeps_layout(interpret):
    for layout, (cl, _fmt) in LAYOUTS.items():
        x, w, b = make_case(2, 4, 5, 6, torch.float32, layout)
        (y,), (dx, _, _) = outputs_and_grads(
            lambda *a, cl=cl: global_response_norm(*a, 1e-6, cl), (x, w, b)
        )
        assert y.stride() == x.stride() and dx.stride() == x.stride(), layout


def test_strided_inputs_equal_contiguous(interpret):
    """Sliced, permuted and offset inputs give the contiguous input's y and gradients."""
    base = torch.randn(3, 6, 8, 10)
    views = {
        "sliced_c": (base[..., ::2], True),
        "sliced_w": (base[:, :, ::2], True),
        "permuted": (torch.randn(2, 5, 7, 6).permute(0, 2, 3, 1), True),  # NCHW memory, NHWC view
        "nhwc_in_cl_memory": (base.contiguous(memory_format=torch.channels_last), True),
        "offset": (base[1:, 1:], False),
    }
    w, b = torch.randn(10), torch.randn(10)
    for name, (xv, cl) in views.items():
        c = xv.shape[3 if cl else 1]
        wc, bc = w[:c].clone().requires_grad_(), b[:c].clone().requires_grad_()
        dy = torch.randn(xv.shape)
        got = outputs_and_grads(
            lambda x, w, b, cl=cl: global_response_norm(x, w, b, 1e-6, cl),
            (xv.detach().requires_grad_(), wc, bc),
            [dy],
        )
        want = outputs_and_grads(
            lambda x, w, b, cl=cl: global_response_norm(x, w, b, 1e-6, cl),
            (xv.contiguous().detach().requires_grad_(), wc, bc),
            [dy],
        )
        torch.testing.assert_close(got[0][0], want[0][0], msg=name)
        for g1, g2 in zip(got[1], want[1]):
            torch.testing.assert_close(g1, g2, msg=name)


def test_expanded_grad_output(interpret):
    x, w, b = make_case(2, 3, 4, 5, torch.float32, "nhwc")
    dy = torch.randn(1, 1, 1, 5).expand(2, 3, 4, 5)
    got = outputs_and_grads(lambda *a: global_response_norm(*a), (x, w, b), [dy])
    want = outputs_and_grads(lambda *a: torch_grn(*a), (x, w, b), [dy])
    for g1, g2 in zip(got[1], want[1]):
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-5)


# ---- values ---------------------------------------------------------------------------------
def test_zero_channel_gets_zero_gradient(interpret):
    """A channel that is zero everywhere in a sample has g = 0: its gradient is 0, as
    PyTorch's norm backward makes it, not NaN."""
    x, w, b = make_case(2, 3, 4, 6, torch.float32, "nhwc")
    with torch.no_grad():
        x[0, :, :, 2] = 0
    gate(x, w, b, True)
    (_,), (dx, _, _) = outputs_and_grads(lambda *a: global_response_norm(*a), (x, w, b))
    assert torch.isfinite(dx).all()


def test_all_zero_sample(interpret):
    x, w, b = make_case(2, 3, 4, 6, torch.float32, "nchw")
    with torch.no_grad():
        x[1] = 0
    gate(x, w, b, False)


def test_nan_propagates(interpret):
    x, w, b = make_case(2, 3, 4, 6, torch.float32, "nhwc")
    with torch.no_grad():
        x[0, 1, 2, 3] = float("nan")
    y = global_response_norm(x, w, b)
    assert torch.isnan(y[0]).all() and torch.isfinite(y[1]).all()  # the mean over c spreads it


def test_large_values_fp16(interpret):
    """Values near fp16's maximum: the sums of squares (here 16 x 6e4^2) overflow fp16 but not
    the float32 accumulator, where PyTorch's fp16 norm gives inf and y NaN."""
    x = torch.full((1, 4, 4, 3), 6e4, dtype=torch.float16)
    w, b = torch.full((3,), -0.5, dtype=torch.float16), torch.zeros(3, dtype=torch.float16)
    y = global_response_norm(x, w, b)
    torch.testing.assert_close(y, torch.full_like(x, 3e4), rtol=1e-3, atol=0)
    assert torch.isnan(torch_grn(x, w, b)).all()


def test_deterministic(interpret):
    x, w, b = make_case(2, 9, 9, 7, torch.float32, "nhwc")
    dy = torch.randn(x.shape)
    first = outputs_and_grads(lambda *a: global_response_norm(*a), (x, w, b), [dy])
    for _ in range(3):
        again = outputs_and_grads(lambda *a: global_response_norm(*a), (x, w, b), [dy])
        assert torch.equal(first[0][0], again[0][0])
        assert all(torch.equal(p, q) for p, q in zip(first[1], again[1]))


def test_empty(interpret):
    for shape in [(0, 3, 4, 5), (2, 0, 4, 5), (2, 3, 0, 5)]:
        x = torch.randn(shape, requires_grad=True)
        w = torch.randn(5, requires_grad=True)
        b = torch.randn(5, requires_grad=True)
        y = global_response_norm(x, w, b)
        assert y.shape == x.shape
        y.sum().backward()
        assert torch.equal(w.grad, torch.zeros(5)) and torch.equal(b.grad, torch.zeros(5))


# ---- the reference path, the custom op ------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_path(reference_path, layout):
    gate(*make_case(2, 5, 3, 11, torch.float32, layout), LAYOUTS[layout][0])


def test_meta_tensors_take_the_custom_op():
    x = torch.empty(2, 5, 6, 8, device="meta", requires_grad=True)
    w = torch.empty(8, device="meta", requires_grad=True)
    y = global_response_norm(x, w, torch.empty(8, device="meta"))
    assert y.shape == x.shape and y.grad_fn is not None
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == (8,)


@pytest.mark.parametrize("path", ["interpreter", "reference"])
def test_custom_op_opcheck(path, monkeypatch):
    """The fake implementations give the real op's shapes and strides, also where the input
    is dense but copied first (NCHW memory viewed as NHWC; NHWC in channels_last memory)."""
    if path == "reference":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on the CPU")
    x, w, b = (t.detach() for t in make_case(2, 3, 4, 5, torch.float32, "nhwc"))
    inputs = {
        "nhwc": (x, True),
        "permuted": (torch.randn(2, 5, 3, 4).permute(0, 2, 3, 1), True),
        "nhwc_in_cl_memory": (x.contiguous(memory_format=torch.channels_last), True),
        "nchw_cl": (torch.randn(2, 5, 3, 4).contiguous(memory_format=torch.channels_last), False),
    }
    for name, (xi, cl) in inputs.items():
        torch.library.opcheck(grn_op, (xi, w, b, 1e-6, cl)), name


def test_parameters_in_another_dtype(interpret):
    """bf16 x with float32 weight and bias (autocast's parameters): y in x's dtype, the
    parameter gradients in theirs."""
    x, w, b = make_case(2, 3, 4, 6, torch.bfloat16, "nhwc")
    w32, b32 = (t.detach().float().requires_grad_() for t in (w, b))
    y = global_response_norm(x, w32, b32)
    assert y.dtype == torch.bfloat16
    y.backward(torch.randn_like(y))
    assert w32.grad.dtype == b32.grad.dtype == torch.float32
    want = torch_grn(x.detach().float(), w32.detach(), b32.detach())
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)


def test_compile_fullgraph_matches_eager(interpret):
    """The custom op under torch.compile (aot_eager: its fake, its autograd) equals eager."""
    x, w, b = make_case(2, 3, 4, 5, torch.float32, "nhwc")
    dy = torch.randn(x.shape)
    compiled = torch.compile(
        lambda *a: global_response_norm(*a), fullgraph=True, backend="aot_eager"
    )
    got = outputs_and_grads(compiled, (x, w, b), [dy])
    want = outputs_and_grads(lambda *a: global_response_norm(*a), (x, w, b), [dy])
    torch.testing.assert_close(got[0][0], want[0][0])
    for g1, g2 in zip(got[1], want[1]):
        torch.testing.assert_close(g1, g2)


def test_functorch_takes_the_composition(interpret):
    x, w, b = (t.detach() for t in make_case(2, 3, 4, 5, torch.float64, "nhwc"))
    grad = torch.func.grad(lambda x: global_response_norm(x, w, b).sum())(x)
    want = torch.autograd.grad(torch_grn(x.requires_grad_(), w, b).sum(), x)[0]
    torch.testing.assert_close(grad, want)


# ---- errors ---------------------------------------------------------------------------------
def test_bad_input_errors():
    x, w, b = torch.randn(2, 3, 4, 5), torch.randn(5), torch.randn(5)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        global_response_norm(x.int(), w, b)
    with pytest.raises(ValueError, match=r"x must be 4-D \(N, H, W, C\)"):
        global_response_norm(x[0], w, b)
    with pytest.raises(ValueError, match=r"weight must hold one value per channel \(5\)"):
        global_response_norm(x, torch.randn(4), b)
    with pytest.raises(ValueError, match=r"bias must hold one value per channel \(3\)"):
        global_response_norm(x, torch.randn(3), b, channels_last=False)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        global_response_norm(x, w, b, eps=-1e-6)
    with pytest.raises(RuntimeError, match="all tensors must be on one device"):
        global_response_norm(x, w.to("meta"), b)
    with pytest.raises(TypeError, match="x must be a Tensor"):
        global_response_norm(x.numpy(), w, b)
    with pytest.raises(ValueError, match="dim must be >= 1"):
        GlobalResponseNorm(0)


# ---- the module -----------------------------------------------------------------------------
def test_module_state_dict_and_repr(interpret):
    m = GlobalResponseNorm(6, eps=1e-5, channels_last=False)
    assert set(m.state_dict()) == {"weight", "bias"} and m.weight.shape == (6,)
    assert "6, eps=1e-05, channels_last=False" in repr(m)
    nn.init.normal_(m.weight)
    x = torch.randn(2, 6, 3, 3)
    torch.testing.assert_close(m(x), torch_grn(x, m.weight, m.bias, 1e-5, False))


class _NotGRN(nn.Module):
    weight = bias = None


def test_from_module_refuses_others():
    with pytest.raises(TypeError, match="expected timm's GlobalResponseNorm"):
        GlobalResponseNorm.from_module(_NotGRN())


def test_from_timm(interpret):
    grn = pytest.importorskip("timm.layers.grn")
    for cl in (True, False):
        theirs = grn.GlobalResponseNorm(7, eps=1e-5, channels_last=cl)
        nn.init.normal_(theirs.weight), nn.init.normal_(theirs.bias)
        ours = GlobalResponseNorm.from_module(theirs)
        assert ours.weight is theirs.weight and ours.bias is theirs.bias
        assert (ours.eps, ours.channels_last) == (1e-5, cl)
        x = torch.randn((2, 3, 4, 7) if cl else (2, 7, 3, 4))
        torch.testing.assert_close(ours(x), theirs(x))


def test_from_hugging_face(interpret):
    m = pytest.importorskip("transformers.models.convnextv2.modeling_convnextv2")
    theirs = m.ConvNextV2GRN(7)
    nn.init.normal_(theirs.weight), nn.init.normal_(theirs.bias)
    ours = GlobalResponseNorm.from_module(theirs)
    assert ours.weight is theirs.weight and ours.weight.shape == (1, 1, 1, 7)
    x = torch.randn(2, 3, 4, 7, requires_grad=True)
    dy = torch.randn(x.shape)
    got = outputs_and_grads(lambda x: ours(x), (x,), [dy])
    want = outputs_and_grads(lambda x: theirs(x), (x,), [dy])
    torch.testing.assert_close(got[0][0], want[0][0])
    torch.testing.assert_close(got[1][0], want[1][0])
    ours(x).backward(dy)
    assert ours.weight.grad.shape == (1, 1, 1, 7)
