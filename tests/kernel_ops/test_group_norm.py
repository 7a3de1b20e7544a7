"""group_norm_act / GroupNormAct against PyTorch's act(F.group_norm(...)) (CPU lane).

TRITON_INTERPRET=1 runs the Triton kernels on small shapes (the `interpret` fixture); tests that
pin the plain-PyTorch reference path unset it. Layouts and strides:
test_group_norm_layouts.py. GPU lane: test_group_norm_gpu.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushape.kernels import group_norm_act
from gpushape.kernels.group_norm import _launch
from gpushape.kernels.group_norm._reference import ACTIVATIONS as ACT_CODE  # name -> code

from ._group_norm_cases import (
    ACTIVATIONS,
    DTYPES,
    KINK,
    LAYOUTS,
    assert_equal,
    case_shape,
    fresh,
    gate,
    gn,
    keep_off_kinks,
    make_case,
    pre_activation64,
    run_grads,
    torch_group_norm_act,
)


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
    x, w, b = make_case(case_shape(layout, 2, 12, 5, 7), dtype, layout)
    gate(x, w, b, 3, activation="gelu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_every_activation(interpret, activation, dtype):
    layout = "nchw-cl" if dtype == torch.bfloat16 else "nchw"
    x, w, b = make_case((2, 8, 4, 5), dtype, layout)
    gate(x, w, b, 4, activation=activation)


@pytest.mark.parametrize(
    ("shape", "groups", "layout", "activation"),
    [
        ((2, 1), 1, "nc", "none"),  # one element a group
        ((3, 6), 3, "nc", "relu"),  # two
        ((2, 65), 5, "nc", "silu"),  # 2-D: channels fastest, two channel blocks
        ((1, 1025), 1, "nc", "gelu"),  # one group of more channels than the group kernel's step
        ((2, 1030), 2, "nc", "hardswish"),
        ((2, 3, 1), 3, "ncl", "gelu_tanh"),
        ((1, 1, 63), 1, "ncl", "relu"),
        ((1, 1, 64), 1, "ncl", "none"),
        ((1, 1, 65), 1, "ncl", "silu"),
        ((2, 4, 255), 2, "ncl", "gelu"),  # pixels around a tile (256)
        ((1, 2, 257), 2, "ncl", "hardswish"),
        ((1, 65, 3), 5, "ncl", "relu"),
        ((1, 3, 1023), 1, "ncl", "gelu_tanh"),
        ((3, 5, 7, 9), 5, "nchw", "relu"),  # odd everything, one channel a group
        ((2, 6, 1, 17), 2, "nchw", "silu"),
        ((2, 65, 3, 2), 13, "nchw-cl", "gelu"),  # channels fastest, past one channel block (64)
        ((1, 128, 2, 2), 2, "nchw-cl", "none"),
        ((2, 7, 1, 1), 7, "nchw-cl", "relu"),  # one pixel: channels_last and contiguous at once
        ((2, 6, 1, 17), 3, "nchw-cl", "hardswish"),  # H = 1
        ((2, 6, 17, 1), 3, "nchw-cl", "gelu_tanh"),  # W = 1
        ((1, 4, 2, 3, 5), 2, "nchw", "silu"),  # 5-D
    ],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_odd_shapes(interpret, shape, groups, layout, activation):
    """Groups of one element, channel and pixel counts around the tiles' widths, the group
    kernel's channel loop, one-pixel and one-row images, 2-D, 3-D and 5-D inputs."""
    gate(*make_case(shape, torch.float32, layout), groups, activation=activation)


# the fixtures (interpret: a skip check; _seed) need no reset between examples
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(1, 3),
    groups=st.integers(1, 4),
    per_group=st.integers(1, 5),
    spatial=st.lists(st.integers(1, 9), min_size=0, max_size=2),
    channels_last=st.booleans(),
    activation=st.sampled_from(ACTIVATIONS),
)
def test_property_shapes(interpret, n, groups, per_group, spatial, channels_last, activation):
    """Any (N, C, *spatial) with C = groups * per_group; 4-D inputs in either layout."""
    shape = (n, groups * per_group, *spatial)
    if n * math.prod(spatial) == 1:
        shape = (2, *shape[1:])  # F.group_norm refuses a single value a channel
    layout = "nchw-cl" if channels_last and len(shape) == 4 else "nchw"
    torch.manual_seed(len(shape) * 1000 + sum(shape))
    gate(*make_case(shape, torch.float32, layout), groups, activation=activation)


@pytest.mark.parametrize("layout", ["nchw", "nchw-cl", "ncl"])
@pytest.mark.parametrize("groups", [1, 6], ids=["one_group", "group_per_channel"])
def test_num_groups_one_and_c(interpret, layout, groups):
    x, w, b = make_case(case_shape(layout, 2, 6, 3, 4), torch.float32, layout)
    gate(x, w, b, groups, activation="relu")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("affine", ["weight", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_without_bias_or_affine(interpret, affine, activation, dtype):
    """weight only (bias None), and affine=False (both None): no gradient for the absent."""
    x, w, b = make_case((2, 8, 3, 5), dtype, "nchw", affine=affine)
    assert b is None and (w is None) == (affine == "none")
    gate(x, w, b, 2, activation=activation)


@pytest.mark.parametrize("eps", [0.0, 1e-3, 0.5])
def test_eps(interpret, eps):
    gate(*make_case((2, 6, 4, 3), torch.float32, "nchw-cl"), 3, eps=eps, activation="silu")


@pytest.mark.parametrize("layout", ["nchw", "nchw-cl", "nc"])
def test_mean_far_from_zero(interpret, layout):
    """x = 1000 + N(0, 1): the one-pass E[x^2] - E[x]^2 in float32 would lose most digits of
    the variance (checked here on the same input); the kernels' shifted sums must not."""
    x, w, b = make_case(
        case_shape(layout, 2, 8, 6, 6) if layout != "nc" else (3, 96), torch.float32, layout
    )
    with torch.no_grad():
        x.copy_(1000.0 + torch.randn(x.shape))
    xs = x.detach().reshape(x.shape[0], 2, -1)
    naive = (xs * xs).mean(-1) - xs.mean(-1) ** 2
    true = xs.double().var(-1, correction=0)
    assert ((naive.double() - true).abs() / true).max() > 1e-3  # the input bites
    gate(x, w, b, 2, activation="relu")


def test_float64(interpret):
    for layout in LAYOUTS:
        x, w, b = make_case(case_shape(layout, 2, 6, 3, 4), torch.float64, layout)
        gate(x, w, b, 3, activation="gelu")


@pytest.mark.parametrize("layout", ["nchw", "nchw-cl", "ncl"])
def test_pixel_slices(interpret, layout):
    """Few samples and channels, many pixels: the sums split the pixels over programs, each
    writing its own partial sums, added in order (forward and backward)."""
    x, w, b = make_case(case_shape(layout, 1, 4, 30, 30), torch.float32, layout)
    v = _launch.view(_launch.dense(x.detach()))
    dt = x.dtype
    fwd = _launch.plan(False, v, 2, ACT_CODE["silu"], (dt, dt, dt, dt), x.device)
    bwd = _launch.plan(True, v, 2, ACT_CODE["silu"], (dt,) * 6, x.device)
    assert fwd.splits > 1 and bwd.splits > 1
    gate(x, w, b, 2, activation="silu")


def test_many_samples(interpret):
    """More samples than the parameter-gradient kernel sums a step (64)."""
    gate(*make_case((70, 4, 3), torch.float32, "ncl"), 2, activation="relu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradcheck_float64(interpret, activation):
    for layout in ("nchw", "nchw-cl", "ncl", "nc"):
        x, w, b = make_case(case_shape(layout, 2, 4, 2, 3), torch.float64, layout)
        keep_off_kinks(x, 2, w, b, 1e-5, activation)
        assert torch.autograd.gradcheck(
            lambda x, w, b: group_norm_act(x, 2, w, b, 1e-5, activation),
            (x, w, b),
            fast_mode=True,
        ), layout


# ---- values -----------------------------------------------------------------------------------
def test_gate_inputs_keep_off_kinks():
    """The gate moves x off ReLU's and Hardswish's kinks (where float32 rounding alone may flip
    an element's gradient)."""
    x, w, b = make_case((2, 6, 5, 4), torch.float32, "nchw")
    with torch.no_grad():  # plant pre-activations 1e-7 from -3, 0 and 3 (x moves the stats)
        for _ in range(40):
            for target, (h, wi) in ((-3.0, (0, 0)), (0.0, (2, 3)), (3.0, (4, 1))):
                z = pre_activation64(x, 2, w, b)
                rstd = torch.rsqrt(x[0, :3].double().var(correction=0) + 1e-5)
                gain = w[1].double() * rstd
                x[0, 1, h, wi] -= float((z[0, 1, h, wi] - target - 1e-7) / gain)
    z = pre_activation64(x, 2, w, b)
    for at in (-3.0, 0.0, 3.0):
        assert ((z - at).abs() < KINK).sum() >= 1, at
    keep_off_kinks(x, 2, w, b, 1e-5, "relu")
    assert (pre_activation64(x, 2, w, b).abs() >= KINK).all()
    keep_off_kinks(x, 2, w, b, 1e-5, "hardswish")
    z = pre_activation64(x, 2, w, b)
    assert ((z + 3).abs() >= KINK).all() and ((z - 3).abs() >= KINK).all()


@pytest.mark.parametrize("activation", ["relu", "hardswish"])
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_pre_activation_exactly_at_the_kink(interpret, activation, layout):
    """Channels with weight 0 have the pre-activation z = bias exactly, whatever x: ReLU at
    z = 0 and Hardswish at z = -3, 0, 3 take PyTorch's derivative there (ReLU's 0; Hardswish's
    0 at -3 and 1 at 3), seen in those channels' bias gradients."""
    x, w, b = make_case((2, 8, 3, 4), torch.float32, layout)
    kinks = [0.0] if activation == "relu" else [-3.0, 0.0, 3.0]
    with torch.no_grad():
        for i, at in enumerate(kinks):
            w[2 * i + 1] = 0.0
            b[2 * i + 1] = at
    keep_off_kinks(x, 4, w, b, 1e-5, activation)  # the other channels; these can't move
    dy = torch.randn(x.shape)
    got = run_grads(gn(4, activation=activation), (x, w, b), dy)
    want = run_grads(
        lambda x, w, b: torch_group_norm_act(x, 4, w, b, 1e-5, activation), (x, w, b), dy
    )
    for i, at in enumerate(kinks):
        c = 2 * i + 1
        d = {0.0: 0.0 if activation == "relu" else 0.5, -3.0: 0.0, 3.0: 1.0}[at]
        expected_db = (dy[:, c] * d).sum()
        torch.testing.assert_close(want[3][c], expected_db)  # PyTorch's derivative, as stated
        torch.testing.assert_close(got[3][c], expected_db, msg=f"dbias at z = {at}")
    gate(x, w, b, 4, activation=activation, kinks=False)


def test_constant_group(interpret):
    """A group whose values are all equal (variance 0: 1/std = 1/sqrt(eps))."""
    x, w, b = make_case((2, 6, 3, 4), torch.float32, "nchw")
    with torch.no_grad():
        x[1, 2:4] = 1.5
    gate(x, w, b, 3, activation="gelu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_nan_propagates_like_torch(interpret, activation):
    """A NaN makes its whole (sample, group) NaN in y, as in PyTorch, and the gradients match
    PyTorch's composition: dx and dweight NaN for that group's channels; dbias NaN there
    where the activation's derivative is NaN at NaN (SiLU, GELU), else finite, as torch's
    ReLU backward (threshold_backward) passes dy on at NaN.
    Hardswish: PyTorch's own backward disagrees with itself at NaN (its scalar loop passes dy
    on, its vectorized loop gives NaN: it depends on the tensor's length), so its dbias there
    is not compared."""
    x, w, b = make_case((2, 6, 3, 4), torch.float32, "nchw")
    with torch.no_grad():
        x[0, 1, 2, 3] = float("nan")
    y = group_norm_act(x, 3, w, b, activation=activation)
    assert torch.isnan(y[0, :2]).all() and torch.isfinite(y[0, 2:]).all()
    assert torch.isfinite(y[1]).all()
    if activation != "hardswish":
        gate(x, w, b, 3, activation=activation, kinks=False)
        return
    dy = torch.randn(x.shape)
    got = run_grads(gn(3, activation=activation), fresh(x, w, b), dy)
    want = run_grads(
        lambda x, w, b: torch_group_norm_act(x, 3, w, b, 1e-5, activation), fresh(x, w, b), dy
    )
    for name, g, e in zip(("y", "dx", "dw"), got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)
    torch.testing.assert_close(got[3][2:], want[3][2:], rtol=1e-5, atol=1e-5)


def test_first_pixel_outlier(interpret):
    """One outlier pixel at every channel's first position (a conv output's padded corner, say):
    PyTorch's statistics stay accurate (Welford); so must the kernels' (a shift by that very
    pixel would cancel most digits of s2 - s1^2 / P)."""
    x, w, b = make_case((1, 4, 16, 16), torch.float32, "nchw")
    with torch.no_grad():
        x[:, :, 0, 0] = 16.0
    gate(x, w, b, 1, activation="none")


def test_values_near_fp16_max(interpret):
    """fp16 x near 6e4: squares and sums overflow fp16, not the float32 accumulators."""
    x, w, b = make_case((2, 4, 5, 6), torch.float16, "nchw-cl")
    with torch.no_grad():
        x.copy_((6e4 + 2e3 * torch.rand(x.shape)).clamp(max=65000))
    gate(x, w, b, 2, activation="silu")


def test_deterministic(interpret):
    """The same inputs give the same y and gradients bit for bit (the pixel-split sums too)."""
    x, w, b = make_case((1, 4, 30, 30), torch.float32, "nchw-cl")
    dy = torch.randn(x.shape)
    first = run_grads(gn(2, activation="relu"), (x, w, b), dy)
    for _ in range(2):
        assert_equal(run_grads(gn(2, activation="relu"), (x, w, b), dy), first)


def test_empty_batch(interpret):
    for layout in ("nchw", "nchw-cl", "ncl"):
        x, w, b = make_case(case_shape(layout, 0, 4, 3, 3), torch.float32, layout)
        y = group_norm_act(x, 2, w, b, activation="relu")
        assert y.shape == x.shape
        y.sum().backward()
        assert torch.equal(w.grad, torch.zeros(4)) and torch.equal(b.grad, torch.zeros(4))
        assert x.grad.shape == x.shape
