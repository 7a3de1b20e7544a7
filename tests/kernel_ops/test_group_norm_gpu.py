"""group_norm_act on a CUDA GPU (`pytest -m gpu` on the GPU machine): the numeric gate at
ResNet-50-GN's and a PoolFormer's GroupNorm shapes and in every dtype, layout and activation,
the pixel-split sums, a mean far from zero, torch.compile with Inductor, CUDA-graph capture and
replay, a bitwise-deterministic backward, autocast's float32 output, parameters in another dtype
than x, opcheck on the custom ops, and more than 2^31 elements. CPU lane: test_group_norm.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels import GroupNormAct, group_norm_act
from gpushape.kernels.group_norm import _launch
from gpushape.kernels.group_norm._reference import ACTIVATIONS as ACT_CODE  # name -> code

from ._group_norm_cases import (
    ACTIVATIONS,
    LAYOUTS,
    case_shape,
    gate,
    keep_off_kinks,
    make_case,
    torch_group_norm_act,
)
from ._numeric import outputs_and_grads

CUDA = torch.device("cuda")
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
GATE_CASES = [  # shape, groups, dtype, layout, activation
    # ResNet-50-GN (32 groups, ReLU after most norms), batch 8, as trained
    ((8, 64, 112, 112), 32, BF16, "nchw", "relu"),
    ((8, 256, 56, 56), 32, BF16, "nchw", "relu"),
    ((8, 512, 28, 28), 32, BF16, "nchw-cl", "relu"),
    ((8, 1024, 14, 14), 32, FP16, "nchw", "relu"),
    ((8, 2048, 7, 7), 32, FP32, "nchw-cl", "none"),
    # PoolFormer's GroupNorm1 (one group), GELU in its MLP
    ((16, 64, 56, 56), 1, BF16, "nchw", "gelu"),
    ((16, 320, 14, 14), 1, FP32, "nchw-cl", "gelu"),
    # sizes off every tile, other activations, 2-D / 3-D, a group of more than 1024 channels
    ((3, 33, 35, 37), 11, FP32, "nchw", "silu"),
    ((5, 130, 9, 11), 13, BF16, "nchw-cl", "hardswish"),
    ((4, 96, 1000), 8, FP16, "ncl", "gelu_tanh"),
    ((64, 4096), 32, FP32, "nc", "none"),
    ((2, 2050, 3, 3), 1, BF16, "nchw-cl", "silu"),
    ((2, 2050, 3, 3), 2, FP32, "nchw", "relu"),
]


def _case_id(case) -> str:
    shape, groups, dtype, layout, activation = case
    return f"{'x'.join(map(str, shape))}-g{groups}-{str(dtype)[6:]}-{layout}-{activation}"


def _gn(groups, activation="none", eps=1e-5):
    return lambda x, w, b: group_norm_act(x, groups, w, b, eps, activation)


def _run(fn, args, dy):
    """(y, dx, dw, db) of fn(*args) for the output gradient dy."""
    (y,), grads = outputs_and_grads(fn, args, [dy])
    return (y, *grads)


def _assert_equal(got, want, names=("y", "dx", "dw", "db"), strides=True) -> None:
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype and (not strides or a.stride() == b.stride()), name
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---- the numeric gate -----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", GATE_CASES, ids=_case_id)
def test_gpu_gate(case):
    shape, groups, dtype, layout, activation = case
    x, w, b = make_case(shape, dtype, layout, device=CUDA)
    assert x.is_contiguous(memory_format=LAYOUTS[layout][1])
    gate(x, w, b, groups, activation=activation)
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl", "ncl"])
@pytest.mark.parametrize("dtype", [FP32, BF16, FP16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gpu_every_activation(activation, dtype, layout):
    x, w, b = make_case(case_shape(layout, 4, 64, 33, 31), dtype, layout, device=CUDA)
    gate(x, w, b, 8, activation=activation)


@pytest.mark.gpu
@pytest.mark.parametrize("affine", ["weight", "none"])
def test_gpu_without_bias_or_affine(affine):
    x, w, b = make_case((8, 256, 28, 28), BF16, "nchw-cl", affine=affine, device=CUDA)
    gate(x, w, b, 32, activation="relu")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_gpu_pixel_slices(layout):
    """Few samples and channels, many pixels: the sums split the pixels over many programs,
    each writing its own partial sums, added in order (forward and backward)."""
    x, w, b = make_case((2, 32, 250, 251), FP32, layout, device=CUDA)
    v = _launch.view(_launch.dense(x.detach()))
    dt = x.dtype
    assert _launch.plan(False, v, 4, ACT_CODE["silu"], (dt,) * 4, x.device).splits > 8
    assert _launch.plan(True, v, 4, ACT_CODE["silu"], (dt,) * 6, x.device).splits > 8
    gate(x, w, b, 4, activation="silu")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_gpu_mean_far_from_zero(layout):
    """x = 1000 + N(0, 1): a one-pass E[x^2] - E[x]^2 in float32 would lose the variance.
    SiLU, smooth: under ReLU the pre-activations within float32 rounding of 0 (the mean's
    rounding at 1000 is 6e-5) flip between ours and torch's, a gradient of order 1 each, and
    the gate would compare which elements flipped, not the statistics."""
    x, w, b = make_case((8, 256, 56, 56), FP32, layout, device=CUDA)
    with torch.no_grad():
        x.copy_(1000.0 + torch.randn(x.shape, device=CUDA))
    gate(x, w, b, 32, activation="silu")


@pytest.mark.gpu
def test_gpu_first_pixel_outlier():
    """An outlier at every channel's first pixel (a padded corner): the statistics must stay
    as accurate as PyTorch's."""
    x, w, b = make_case((4, 64, 56, 56), FP32, "nchw", device=CUDA)
    with torch.no_grad():
        x[:, :, 0, 0] = 30.0
    gate(x, w, b, 8, activation="none")


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "hardswish"])
def test_gpu_pre_activation_exactly_at_the_kink(activation):
    """weight-0 channels have z = bias exactly: ReLU at 0, Hardswish at -3, 0 and 3 take
    PyTorch's derivatives there (the gate, on the bias gradient)."""
    x, w, b = make_case((4, 64, 14, 14), FP32, "nchw-cl", device=CUDA)
    with torch.no_grad():
        for i, at in enumerate([0.0] if activation == "relu" else [-3.0, 0.0, 3.0]):
            w[8 * i + 3] = 0.0
            b[8 * i + 3] = at
    keep_off_kinks(x, 8, w, b, 1e-5, activation)
    gate(x, w, b, 8, activation=activation, kinks=False)


# ---- torch.compile, CUDA graphs, determinism --------------------------------------------------
def _compiled_equals_eager(x, w, b, groups, activation) -> None:
    """fullgraph=True with Inductor: the custom op between two fused pointwise kernels (scalings
    by powers of two, exact) gives eager's y and gradients bit for bit."""
    torch._dynamo.reset()
    dy = torch.randn_like(x)

    def fn(x, w, b):
        return 2.0 * group_norm_act(0.5 * x, groups, w, b, 1e-5, activation)

    compiled = torch.compile(fn, fullgraph=True)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        got = _run(compiled, (x, w, b), dy)
    _assert_equal(got, _run(fn, (x, w, b), dy), strides=False)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl", "ncl"])
def test_gpu_torch_compile_matches_eager(layout):
    x, w, b = make_case(case_shape(layout, 8, 256, 28, 28), BF16, layout, device=CUDA)
    _compiled_equals_eager(x, w, b, 32, "relu")


@pytest.mark.gpu
def test_gpu_torch_compile_strided_input():
    """An input the kernels copy contiguous first: the fake must give those strides too,
    which Inductor trusts."""
    base = make_case((4, 64, 14, 14), BF16, "nchw", device=CUDA)[0].detach()
    x = base.transpose(2, 3).requires_grad_()
    w, b = (torch.randn(64, device=CUDA).to(BF16).requires_grad_() for _ in range(2))
    _compiled_equals_eager(x, w, b, 8, "gelu")


@pytest.mark.gpu
def test_gpu_compiled_module():
    torch._dynamo.reset()
    eager = GroupNormAct(32, 256, activation="relu").to(CUDA)
    torch.nn.init.normal_(eager.weight), torch.nn.init.normal_(eager.bias)
    compiled = GroupNormAct(32, 256, activation="relu").to(CUDA)
    compiled.load_state_dict(eager.state_dict())
    fn = torch.compile(compiled, fullgraph=True)
    x = torch.randn(8, 256, 28, 28, device=CUDA).contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(x)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        got = outputs_and_grads(fn, (x.clone().requires_grad_(),), [dy], whole_backward=True)
    want = outputs_and_grads(eager, (x.clone().requires_grad_(),), [dy], whole_backward=True)
    torch.testing.assert_close(got[0][0], want[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][0], want[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled.weight.grad, eager.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled.bias.grad, eager.bias.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_gpu_cuda_graph_replay(layout):
    """Forward and backward (all three gradients) captured in a CUDA graph; new inputs,
    parameters and output gradient copied in; the replay equals eager on them bit for bit."""
    fn = _gn(32, "relu")
    static = make_case((8, 256, 28, 28), BF16, layout, device=CUDA)
    static_dy = torch.randn_like(static[0]).detach()

    def step():
        y = fn(*static)
        return (y.detach(), *torch.autograd.grad(y, static, static_dy))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()  # held below, with static and static_dy: the graph's memory
    fresh = make_case((8, 256, 28, 28), BF16, layout, device=CUDA)
    dy = torch.randn_like(static_dy)
    with torch.no_grad():
        for s, f in zip(static, fresh):
            s.copy_(f)
        static_dy.copy_(dy)
    graph.replay()
    want = _run(fn, fresh, dy)
    torch.cuda.synchronize()
    _assert_equal(outs, want)
    graph.replay()  # again, on the same inputs: the same values
    torch.cuda.synchronize()
    _assert_equal(outs, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("shape", "groups"),
    [((8, 256, 56, 56), 32), ((2, 32, 250, 251), 4), ((64, 64, 28, 28), 1)],
    ids=["resnet-stage1", "pixel-split", "one-group"],
)
def test_gpu_backward_is_bitwise_deterministic(shape, groups, dtype):
    x, w, b = make_case(shape, dtype, "nchw-cl", device=CUDA)
    dy = torch.randn_like(x)
    first = _run(_gn(groups, "silu"), (x, w, b), dy)
    for _ in range(20):
        _assert_equal(_run(_gn(groups, "silu"), (x, w, b), dy), first)


# ---- dtypes: autocast, parameters in another dtype ---------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_gpu_autocast_gives_float32(dtype, layout):
    """Under CUDA autocast F.group_norm runs in float32 and returns float32: so does ours (in
    x's layout), within float32 rounding of the composition on float32 inputs; dx in x's dtype,
    the float32 parameters' gradients in float32."""
    x, w, b = make_case((8, 256, 28, 28), dtype, layout, device=CUDA, param_dtype=FP32)
    keep_off_kinks(x, 32, w, b, 1e-5, "relu")
    with torch.autocast("cuda", dtype=dtype):
        want_dtype = F.group_norm(x.detach(), 32, w.detach(), b.detach()).dtype
        y = group_norm_act(x, 32, w, b, activation="relu")
    assert want_dtype == FP32 and y.dtype == FP32
    assert y.is_contiguous(memory_format=LAYOUTS[layout][1])
    want = torch_group_norm_act(x.detach().float(), 32, w.detach(), b.detach(), 1e-5, "relu")
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
    assert dx.dtype == dtype and dw.dtype == db.dtype == FP32


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_gpu_parameters_in_another_dtype(layout):
    """bf16 x with float32 parameters (autocast keeps them in float32): y and dx in bf16, the
    parameter gradients in float32, against the composition in float32 within a bf16 unit."""
    x, w, b = make_case((8, 512, 28, 28), BF16, layout, device=CUDA, param_dtype=FP32)
    keep_off_kinks(x, 32, w, b, 1e-5, "relu")
    dy = torch.randn_like(x)
    y, dx, dw, db = _run(_gn(32, "relu"), (x, w, b), dy)
    assert y.dtype == dx.dtype == BF16 and dw.dtype == db.dtype == FP32
    x32 = x.detach().float().requires_grad_()
    w32, b32 = (t.detach().clone().requires_grad_() for t in (w, b))
    want = _run(_gn(32, "relu"), (x32, w32, b32), dy.float())
    one_unit = dict(rtol=2**-7, atol=2**-7)
    torch.testing.assert_close(y.float(), want[0], **one_unit)
    torch.testing.assert_close(dx.float(), want[1], **one_unit)
    scale = want[2].abs().max().item()
    torch.testing.assert_close(dw, want[2], rtol=2**-7, atol=2**-7 * scale)
    torch.testing.assert_close(db, want[3], rtol=2**-7, atol=2**-7 * want[3].abs().max().item())


# ---- the custom ops, errors ------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_custom_ops_opcheck():
    x, w, b = (t.detach() for t in make_case((2, 64, 7, 9), FP32, "nchw", device=CUDA))
    fwd = torch.ops.gpushape.group_norm_act
    bwd = torch.ops.gpushape.group_norm_act_backward
    cases = [
        (x, w, b, ACT_CODE["relu"], False),
        (x.contiguous(memory_format=torch.channels_last), w, b, ACT_CODE["silu"], False),
        (x.transpose(2, 3), w, b, ACT_CODE["gelu"], False),
        (x.to(BF16), w, b, ACT_CODE["hardswish"], True),
    ]
    for xi, wi, bi, act, out_fp32 in cases:
        args = (xi.requires_grad_(), wi.requires_grad_(), bi.requires_grad_(), 8, 1e-5, act)
        torch.library.opcheck(fwd, (*args, out_fp32))
        y, stats = fwd(xi.detach(), wi.detach(), bi.detach(), 8, 1e-5, act, out_fp32)
        dy = torch.randn_like(y)
        torch.library.opcheck(bwd, (dy, xi.detach(), wi.detach(), bi.detach(), stats, 8, 1e-5, act))


@pytest.mark.gpu
def test_gpu_mixed_devices_error():
    x = torch.randn(2, 8, 3, 3, device=CUDA)
    with pytest.raises(RuntimeError, match="all tensors must be on one device"):
        group_norm_act(x, 2, torch.ones(8), torch.zeros(8, device=CUDA))


# ---- more than 2^31 elements --------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nchw-cl"])
def test_gpu_forward_backward_past_2_pow_31_elements(layout):
    """129 x 1024 x 128 x 128 bf16 (2^31 + 2^24 elements, 4.3 GB a tensor; the last sample lies
    wholly past 2^31), 32 groups, SiLU (smooth: no gradient flips at a kink between two float32
    computations of the pre-activation): y and dx of every sample, dw and db, against PyTorch's
    composition run in float32 a few samples at a time (about 20 GB of GPU memory in all)."""
    n, c, h, w = 129, 1024, 128, 128
    fmt = LAYOUTS[layout][1]
    x = torch.randn((n, c, h, w), device=CUDA, dtype=BF16).contiguous(memory_format=fmt)
    x.requires_grad_()
    assert x.numel() > 2**31
    wt = (1 + 0.5 * torch.randn(c, device=CUDA)).to(BF16).requires_grad_()
    bs = (0.3 * torch.randn(c, device=CUDA)).to(BF16).requires_grad_()
    dy = torch.randn((n, c, h, w), device=CUDA, dtype=BF16).contiguous(memory_format=fmt)
    y = group_norm_act(x, 32, wt, bs, 1e-5, "silu")
    dx, dw, db = torch.autograd.grad(y, (x, wt, bs), dy)
    y = y.detach()
    dw_ref = torch.zeros(c, device=CUDA, dtype=torch.float64)
    db_ref = torch.zeros_like(dw_ref)
    w32, b32 = (t.detach().float().requires_grad_() for t in (wt, bs))
    tol = dict(rtol=2**-7, atol=1e-3)  # one bf16 unit apart at most
    for start in range(0, n, 8):
        part = slice(start, start + 8)
        x32 = x.detach()[part].float().requires_grad_()
        y32 = torch_group_norm_act(x32, 32, w32, b32, 1e-5, "silu")
        dx32, dw32, db32 = torch.autograd.grad(y32, (x32, w32, b32), dy[part].float())
        torch.testing.assert_close(y[part].float(), y32.to(BF16).float(), **tol)
        torch.testing.assert_close(dx[part].float(), dx32.to(BF16).float(), **tol)
        dw_ref += dw32.double()
        db_ref += db32.double()
        del x32, y32, dx32
    for name, got, ref in (("dw", dw, dw_ref), ("db", db, db_ref)):
        scale = ref.abs().max().item()
        torch.testing.assert_close(
            got.double(), ref, rtol=2**-7, atol=1e-3 * scale, msg=lambda m, n=name: f"{n}: {m}"
        )
    del x, y, dy, dx
    torch.cuda.empty_cache()
