"""group_norm_act / GroupNormAct: the reference path, the custom ops (meta, opcheck,
torch.compile, torch.func), parameter dtypes and autocast, errors, the module (CPU lane).

Values and shapes: test_group_norm.py; layouts: test_group_norm_layouts.py. GPU lane:
test_group_norm_gpu.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.kernels import GroupNormAct, group_norm_act
from gpushape.kernels.group_norm._reference import ACTIVATIONS as ACT_CODE  # name -> code

from ._group_norm_cases import (
    ACTIVATIONS,
    CL,
    LAYOUTS,
    TORCH_ACT,
    case_shape,
    fresh,
    gate,
    gn,
    make_case,
    run_grads,
    torch_group_norm_act,
)
from ._numeric import outputs_and_grads


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def reference_path(monkeypatch):
    """CPU tensors on the plain-PyTorch reference (TRITON_INTERPRET unset)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


# ---- the reference path (CPU without the interpreter) ---------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reference_path(reference_path, layout, dtype):
    for activation in ACTIVATIONS:
        x, w, b = make_case(case_shape(layout, 2, 6, 4, 5), dtype, layout)
        gate(x, w, b, 3, activation=activation)


def test_reference_path_float64_and_affine(reference_path):
    gate(*make_case((2, 6, 4, 5), torch.float64, "nchw-cl"), 2, activation="silu")
    gate(*make_case((2, 6, 4, 5), torch.float32, "nchw", affine="weight"), 2, activation="relu")
    gate(*make_case((2, 6, 20), torch.float32, "ncl", affine="none"), 6, activation="hardswish")


def test_interpreter_equals_reference(interpret, monkeypatch):
    """The kernels and the plain-PyTorch reference agree closely (both float32 inside)."""
    x, w, b = make_case((2, 8, 5, 3), torch.float32, "nchw-cl")
    dy = torch.randn(x.shape)
    got = run_grads(gn(4, activation="hardswish"), fresh(x, w, b), dy)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    want = run_grads(gn(4, activation="hardswish"), fresh(x, w, b), dy)
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


# ---- the custom ops: meta tensors, opcheck, torch.compile, torch.func ------------------------
def test_meta_tensors_take_the_custom_op():
    for fmt in (torch.contiguous_format, CL):
        x = torch.empty(2, 6, 4, 5, device="meta").contiguous(memory_format=fmt)
        x.requires_grad_()
        w = torch.empty(6, device="meta", requires_grad=True)
        b = torch.empty(6, device="meta", requires_grad=True)
        y = group_norm_act(x, 3, w, b, activation="relu")
        assert y.shape == x.shape and y.stride() == x.stride() and y.grad_fn is not None
        y.sum().backward()
        assert x.grad.shape == x.shape and w.grad.shape == (6,) and b.grad.shape == (6,)
    x = torch.empty(2, 6, 7, device="meta", dtype=torch.bfloat16)
    y = group_norm_act(x, 2)
    assert y.shape == x.shape and y.dtype == torch.bfloat16


def _opcheck_inputs():
    """(name, x, weight, bias, out_fp32): dense inputs in each layout, one the kernels copy
    first (its y must come back contiguous in the fake too), bf16 with a float32 y."""
    x, w, b = (t.detach() for t in make_case((2, 6, 3, 4), torch.float32, "nchw"))
    xb = x.to(torch.bfloat16)
    return [
        ("nchw", x, w, b, False),
        ("nchw-cl", x.contiguous(memory_format=CL), w, b, False),
        ("ncl", x.reshape(2, 6, 12), w, b, False),
        ("nc", x[:, :, 0, 0].contiguous(), w, b, False),
        ("transposed", x.transpose(2, 3), w, b, False),
        ("bf16-out-fp32", xb, w.to(torch.bfloat16), b.to(torch.bfloat16), True),
        ("bf16-fp32-params", xb.contiguous(memory_format=CL), w, b, False),
    ]


@pytest.mark.parametrize("path", ["interpreter", "reference"])
def test_custom_ops_opcheck(path, monkeypatch):
    """Schema, fake implementations (shapes and strides of the real outputs), autograd
    registration and AOT dispatch of both custom ops."""
    if path == "reference":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on the CPU")
    fwd = torch.ops.gpushape.group_norm_act
    bwd = torch.ops.gpushape.group_norm_act_backward
    for i, (name, x, w, b, out_fp32) in enumerate(_opcheck_inputs()):
        act = ACT_CODE[ACTIVATIONS[i % len(ACTIVATIONS)]]
        args = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), 3, 1e-5, act)
        torch.library.opcheck(fwd, (*args, out_fp32))
        y, stats = fwd(*(t.detach() if isinstance(t, torch.Tensor) else t for t in args), out_fp32)
        assert stats.shape == (2, 2, 3) and stats.dtype == torch.float32, name
        assert y.dtype == (torch.float32 if out_fp32 else x.dtype), name
        dy = torch.randn(y.shape, dtype=y.dtype)
        bwd_args = (dy, x.detach(), w.detach(), b.detach(), stats, 3, 1e-5, act)
        torch.library.opcheck(bwd, bwd_args)


def _compiled_equals_eager(fn, args, dy):
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with torch._functorch.config.patch(enable_autograd_cache=False):
        got = run_grads(compiled, fresh(*args), dy)
    want = run_grads(fn, fresh(*args), dy)
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        if e is None:
            assert g is None, name
            continue
        assert g.dtype == e.dtype, name
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("path", ["interpreter", "reference"])
def test_compile_fullgraph_matches_eager(path, monkeypatch):
    """The custom ops under torch.compile(fullgraph=True) (aot_eager: their fakes and
    registered autograd) equal the eager autograd.Function: NCHW, channels_last and 3-D, with
    and without affine parameters."""
    if path == "reference":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on the CPU")
    for layout, affine in (("nchw", "both"), ("nchw-cl", "weight"), ("ncl", "none")):
        x, w, b = make_case(case_shape(layout, 2, 6, 3, 4), torch.float32, layout, affine=affine)
        _compiled_equals_eager(
            lambda x, w, b: 2.0 * group_norm_act(0.5 * x, 3, w, b, 1e-5, "silu"),
            (x, w, b),
            torch.randn(x.shape),
        )


@pytest.mark.parametrize("path", ["interpreter", "reference"])
def test_compiled_module_matches_eager(path, monkeypatch):
    """A compiled GroupNormAct (fullgraph) gives the eager module's y, dx and parameter
    gradients."""
    if path == "reference":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run Triton kernels on the CPU")
    eager = GroupNormAct(3, 6, activation="gelu")
    nn.init.normal_(eager.weight), nn.init.normal_(eager.bias)
    compiled = GroupNormAct(3, 6, activation="gelu")
    compiled.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    fn = torch.compile(compiled, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 6, 4, 3).contiguous(memory_format=CL)
    dy = torch.randn(x.shape)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        got = outputs_and_grads(fn, (x.clone().requires_grad_(),), [dy], whole_backward=True)
    want = outputs_and_grads(eager, (x.clone().requires_grad_(),), [dy], whole_backward=True)
    torch.testing.assert_close(got[0][0], want[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[1][0], want[1][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled.weight.grad, eager.weight.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled.bias.grad, eager.bias.grad, rtol=1e-6, atol=1e-6)


def test_functorch_takes_the_composition(interpret):
    x, w, b = (t.detach() for t in make_case((2, 6, 3, 4), torch.float64, "nchw"))
    grad = torch.func.grad(lambda x: group_norm_act(x, 3, w, b, activation="silu").sum())(x)
    xr = x.clone().requires_grad_()
    want = torch.autograd.grad(torch_group_norm_act(xr, 3, w, b, activation="silu").sum(), xr)[0]
    torch.testing.assert_close(grad, want)


# ---- dtypes: parameters in another dtype, autocast ------------------------------------------
def test_parameters_in_another_dtype(interpret):
    """bf16 x with float32 weight and bias (autocast's parameters): y and dx in x's dtype, the
    parameter gradients in theirs; float32 x with bf16 parameters likewise."""
    x, w, b = make_case((2, 6, 3, 4), torch.bfloat16, "nchw-cl", param_dtype=torch.float32)
    dy = torch.randn(x.shape, dtype=torch.bfloat16)
    y, dx, dw, db = run_grads(gn(3, activation="silu"), (x, w, b), dy)
    assert y.dtype == dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    want = run_grads(
        lambda x, w, b: torch_group_norm_act(x, 3, w, b, activation="silu"),
        fresh(x.float(), w, b),
        dy.float(),
    )
    for name, g, e in zip(("y", "dx", "dw", "db"), (y, dx, dw, db), want):
        torch.testing.assert_close(
            g.float(), e, rtol=2e-2, atol=2e-2, msg=lambda m, n=name: f"{n}: {m}"
        )

    x, w, b = make_case((2, 6, 3, 4), torch.float32, "nchw", param_dtype=torch.bfloat16)
    y, dx, dw, db = run_grads(gn(3, activation="gelu"), (x, w, b), torch.randn(x.shape))
    assert y.dtype == dx.dtype == torch.float32 and dw.dtype == db.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_output_dtype_cpu(interpret, dtype):
    """Under CPU autocast y takes F.group_norm's dtype there (x's: CPU autocast does not run
    group_norm in float32), and values within x's dtype's rounding of the composition; dx
    stays in x's dtype. A float32 x stays float32."""
    x, w, b = make_case((2, 6, 3, 4), dtype, "nchw", param_dtype=torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        want = torch_group_norm_act(x, 3, w, b, activation="relu")
        got = group_norm_act(x, 3, w, b, activation="relu")
        x32 = x.detach().float()
        assert group_norm_act(x32, 3, w, b).dtype == F.group_norm(x32, 3, w, b).dtype
    assert got.dtype == want.dtype, (
        f"y is {got.dtype} under CPU autocast, F.group_norm's {want.dtype}"
    )
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    (dx,) = torch.autograd.grad(got, x, torch.randn(got.shape, dtype=got.dtype))
    assert dx.dtype == dtype


# ---- errors ---------------------------------------------------------------------------------
_X = torch.randn(2, 6, 3, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(x=_X.numpy()), TypeError, "x must be a Tensor"),
        (dict(x=None), TypeError, "x must be a Tensor"),
        (dict(weight=[1.0] * 6), TypeError, "weight must be a Tensor or None"),
        (dict(x=_X.int()), TypeError, "x must be float32, float16 or bfloat16"),
        (dict(x=_X.bool()), TypeError, "x must be float32, float16 or bfloat16"),
        (dict(weight=torch.ones(6, dtype=torch.int64)), TypeError, "weight must be float32"),
        (dict(bias=torch.zeros(6, dtype=torch.int32)), TypeError, "bias must be float32"),
        (dict(x=torch.randn(6)), ValueError, r"x must be \(N, C, \*\), got shape \(6,\)"),
        (dict(x=torch.tensor(1.0)), ValueError, r"x must be \(N, C, \*\)"),
        (dict(num_groups=4), ValueError, "6 channels do not split into 4 groups"),
        (dict(num_groups=0), ValueError, "num_groups must be an int >= 1, got 0"),
        (dict(num_groups=-3), ValueError, "num_groups must be an int >= 1"),
        (dict(num_groups=1.5), ValueError, "num_groups must be an int >= 1"),
        (dict(num_groups=True), ValueError, "num_groups must be an int >= 1"),
        (dict(weight=torch.ones(5)), ValueError, r"weight must hold one value per channel \(6\)"),
        (dict(bias=torch.zeros(7)), ValueError, r"bias must hold one value per channel \(6\)"),
        (dict(eps=-1e-5), ValueError, "eps must be >= 0"),
        (dict(eps=float("nan")), ValueError, "eps must be >= 0"),
        (dict(activation="swish"), ValueError, "activation must be one of"),
        (dict(activation="ReLU"), ValueError, "activation must be one of"),
        (dict(weight=torch.ones(6, device="meta")), RuntimeError, "all tensors must be on one"),
        (dict(bias=torch.zeros(6, device="meta")), RuntimeError, "bias on meta"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_errors(kwargs, error, match):
    args = dict(x=_X, num_groups=3, weight=torch.ones(6), bias=torch.zeros(6))
    args.update(kwargs)
    with pytest.raises(error, match=match) as info:
        group_norm_act(**args)
    assert str(info.value).startswith("group_norm_act: ")


# ---- the module -----------------------------------------------------------------------------
@pytest.mark.parametrize("affine", [True, False])
def test_state_dict_matches_group_norm(affine):
    ref, ours = nn.GroupNorm(2, 6, affine=affine), GroupNormAct(2, 6, affine=affine)
    assert isinstance(ours, nn.GroupNorm)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    if affine:
        nn.init.normal_(ref.weight), nn.init.normal_(ref.bias)
    ours.load_state_dict(ref.state_dict(), strict=True)
    for name, t in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[name], t), name
    ref.load_state_dict(ours.state_dict(), strict=True)
    assert (ours.num_groups, ours.num_channels, ours.eps, ours.affine) == (2, 6, 1e-5, affine)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_module_equals_group_norm_then_activation(interpret, activation):
    ref = nn.GroupNorm(3, 6, eps=1e-4)
    nn.init.normal_(ref.weight), nn.init.normal_(ref.bias)
    ours = GroupNormAct(3, 6, eps=1e-4, activation=activation)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 6, 3, 4)
    torch.testing.assert_close(ours(x), TORCH_ACT[activation](ref(x)), rtol=1e-5, atol=1e-5)
    assert ("activation" in repr(ours)) == (activation != "none")
    if activation != "none":
        assert activation in repr(ours)


def test_module_device_dtype_and_errors():
    m = GroupNormAct(2, 4, dtype=torch.float64, device="meta")
    assert m.weight.dtype == torch.float64 and m.weight.device.type == "meta"
    with pytest.raises(ValueError, match="activation must be one of"):
        GroupNormAct(2, 4, activation="swish")
    with pytest.raises(ValueError):  # nn.GroupNorm's own check
        GroupNormAct(3, 4)


@pytest.mark.parametrize("affine", [True, False])
def test_from_module_shares_parameters(interpret, affine):
    gn = nn.GroupNorm(2, 6, eps=1e-3, affine=affine)
    if affine:
        nn.init.normal_(gn.weight), nn.init.normal_(gn.bias)
    ours = GroupNormAct.from_module(gn, activation="relu")
    assert ours.weight is gn.weight and ours.bias is gn.bias
    assert (ours.num_groups, ours.num_channels, ours.eps, ours.affine) == (2, 6, 1e-3, affine)
    assert ours.activation == "relu" and list(ours.state_dict()) == list(gn.state_dict())
    x = torch.randn(2, 6, 3, 4)
    torch.testing.assert_close(ours(x), F.relu(gn(x)), rtol=1e-5, atol=1e-5)
    if affine:  # a gradient step through ours moves gn's parameters
        ours(x).pow(2).sum().backward()
        assert gn.weight.grad is not None and gn.bias.grad is not None
        with torch.no_grad():
            ours.weight.add_(1.0)
        assert torch.equal(gn.weight, ours.weight)


class _NotGroupNorm(nn.Module):
    num_groups, num_channels, eps, affine = 2, 4, 1e-5, True
    weight = bias = None


@pytest.mark.parametrize("module", [nn.BatchNorm2d(4), nn.LayerNorm(4), _NotGroupNorm()])
def test_from_module_refuses_others(module):
    with pytest.raises(TypeError, match=r"expected an nn\.GroupNorm"):
        GroupNormAct.from_module(module)


def test_from_module_bad_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        GroupNormAct.from_module(nn.GroupNorm(2, 4), activation="mish")


def test_from_timm(interpret):
    norm = pytest.importorskip("timm.layers.norm")
    for theirs in (norm.GroupNorm(8, num_groups=4, eps=1e-6), norm.GroupNorm1(8)):
        nn.init.normal_(theirs.weight), nn.init.normal_(theirs.bias)
        ours = GroupNormAct.from_module(theirs, activation="silu")
        assert ours.weight is theirs.weight and ours.bias is theirs.bias
        assert ours.num_groups == theirs.num_groups and ours.eps == theirs.eps
        x = torch.randn(2, 8, 3, 3, requires_grad=True)
        dy = torch.randn(x.shape)
        got = run_grads(ours, (x,), dy)
        want = run_grads(lambda x, theirs=theirs: F.silu(theirs(x)), (x,), dy)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
