"""batch_norm_act / BatchNormAct2d against PyTorch's BatchNorm2d + add + ReLU.

CPU lane: TRITON_INTERPRET=1 runs the Triton kernels on small shapes (the `interpret` fixture);
tests that pin the plain-PyTorch reference path unset it. GPU lane: `pytest -m gpu`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.kernels.batch_norm_act import (
    BatchNormAct2d,
    batch_norm_act,
    batch_norm_act_apply,
    batch_norm_act_backward,
    batch_norm_stats,
)

from ._numeric import gate_forward_backward

CL = torch.channels_last
CF = torch.contiguous_format
CUDA = torch.device("cuda")


def _torch_composition(training: bool, activation: str, running=None):
    """PyTorch's own BatchNorm2d + add + activation, as a function of (x, w, b[, r])."""
    def fn(x, w, b, r=None):
        stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        rm, rv = (t.to(x.device, stat_dtype) for t in running) if running else (None, None)
        y = F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5) + (0 if r is None else r)
        return F.relu(y) if activation == "relu" else y
    return fn


def _ours(training: bool, activation: str, running=None):
    def fn(x, w, b, r=None):
        rm, rv = (t.clone().to(x.device) for t in running) if running else (None, None)
        return batch_norm_act(x, w, b, rm, rv, training, 0.1, 1e-5, activation, r)
    return fn


def _inputs(shape, dtype, fmt, device="cpu", offset=-2.3, residual=True, affine=True):
    """x with a mean far from zero, fp32 affine parameters (as under autocast), a residual."""
    c = shape[1]
    x = (offset + 0.5 * torch.randn(shape)).to(dtype).to(device, memory_format=fmt)
    w = (1 + 0.3 * torch.randn(c)).to(device) if affine else None
    b = (0.2 * torch.randn(c)).to(device) if affine else None
    r = torch.randn(shape).to(dtype).to(device, memory_format=fmt) if residual else None
    return [t.requires_grad_() if t is not None else None for t in (x, w, b, r)]


def _gate(shape, dtype, fmt, *, training=True, activation="relu", residual=True, affine=True,
          device="cpu", offset=-2.3):
    x, w, b, r = _inputs(shape, dtype, fmt, device, offset, residual, affine)
    running = (0.1 * torch.randn(shape[1]), 0.5 + torch.rand(shape[1]))
    args = (x, w, b) if r is None else (x, w, b, r)
    return gate_forward_backward(
        _ours(training, activation, running), _torch_composition(training, activation, running),
        args, names=("x", "weight", "bias", "residual")[:len(args)])


# ---- numeric gate, Triton kernels in the interpreter ----

GATE_SHAPES = [(3, 1, 5, 7), (2, 3, 7, 5), (2, 63, 3, 5), (2, 65, 5, 3), (4, 16, 24, 20)]
VARIANTS = [  # training, activation, residual, affine
    (True, "none", True, True), (True, "relu", False, True), (True, "none", False, False),
    (False, "relu", True, True), (False, "none", False, True), (False, "relu", False, False)]


@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", GATE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_training_relu_residual_gate(interpret, shape, dtype, fmt):
    _gate(shape, dtype, fmt)


@pytest.mark.parametrize(("training", "activation", "residual", "affine"), VARIANTS)
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
def test_variants_gate(interpret, training, activation, residual, affine, fmt):
    _gate((2, 10, 6, 7), torch.float32, fmt, training=training, activation=activation,
          residual=residual, affine=affine)


def test_fp16_gate(interpret):
    _gate((2, 24, 5, 6), torch.float16, CL)


def test_mean_far_from_zero(interpret):
    """1000 + N(0, 1): a one-pass sum of squares would lose every digit of the variance."""
    _gate((4, 16, 24, 20), torch.float32, CL, offset=1000.0)


def test_gradcheck_float64(interpret):
    x, w, b, r = (t.detach().double().requires_grad_() for t in _inputs((2, 3, 2, 3),
                                                                        torch.float64, CL))
    for training in (True, False):
        rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)

        def fn(x, w, b, r, training=training, rm=rm, rv=rv):
            return batch_norm_act(x, w, b, rm.clone(), rv.clone(), training, residual=r)

        assert torch.autograd.gradcheck(fn, (x, w, b, r), atol=1e-6, fast_mode=True)


# ---- layouts and special values ----

def test_mask_bits_match_the_reference(interpret, monkeypatch):
    x, w, b, r = (t.detach() for t in _inputs((2, 21, 5, 3), torch.float32, CL))
    mean, rstd = batch_norm_stats(x, None, None, 0.1, 1e-5)
    y, bits = batch_norm_act_apply(x, mean, rstd, w, b, r, 1e-5, True, "relu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    y_ref, bits_ref = batch_norm_act_apply(x, mean, rstd, w, b, r, 1e-5, True, "relu")
    assert bits.shape == (2 * 5 * 3, 3) and torch.equal(bits, bits_ref)
    torch.testing.assert_close(y, y_ref)


def _run_fwd_bwd(x, r, dy, w, b):
    x, r = x.detach().requires_grad_(), r.detach().requires_grad_()
    y = batch_norm_act(x, w, b, None, None, True, residual=r)
    y.backward(dy)
    return y.detach(), x.grad, r.grad


def test_strided_inputs_equal_contiguous(interpret):
    """A sliced x, a residual in the other layout and an expanded (stride-0) grad_output give
    the result of contiguous inputs."""
    x, w, b, r = (t.detach() for t in _inputs((2, 8, 6, 5), torch.float32, CL))
    x_sliced = torch.randn(2, 16, 6, 5)[:, ::2]
    x_sliced.copy_(x)
    dy = torch.randn(1, 8, 1, 1).expand(2, 8, 6, 5)
    expected = _run_fwd_bwd(x, r, dy.contiguous(memory_format=CL), w, b)
    got = _run_fwd_bwd(x_sliced, r.contiguous(), dy, w, b)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    for fmt in (CL, CF):  # outputs and gradients keep the input's layout
        y, dx, _ = _run_fwd_bwd(x.contiguous(memory_format=fmt), r, dy, w, b)
        assert y.is_contiguous(memory_format=fmt) and dx.is_contiguous(memory_format=fmt)


def test_nan_propagates_like_torch(interpret):
    x, w, b, r = (t.detach() for t in _inputs((2, 4, 3, 3), torch.float32, CL))
    x[1, 2, 0, 1] = float("nan")
    r[0, 0, 1, 1] = float("nan")
    for training in (True, False):
        rm, rv = torch.zeros(4), torch.ones(4)
        ours = batch_norm_act(x, w, b, rm.clone(), rv.clone(), training, residual=r)
        ref = _torch_composition(training, "relu", (rm, rv))(x, w, b, r)
        assert torch.equal(torch.isnan(ours), torch.isnan(ref))


def test_empty_batch(interpret):
    bn = BatchNormAct2d(5)
    x = torch.randn(0, 5, 4, 4, requires_grad=True).contiguous(memory_format=CL)
    y = bn(x, torch.randn(0, 5, 4, 4))
    y.sum().backward()
    assert y.shape == x.shape and torch.equal(bn.running_mean, torch.zeros(5))
    assert torch.equal(bn.running_var, torch.ones(5)) and bn.weight.grad.abs().sum() == 0


def test_repeated_backward_is_bitwise_equal(interpret):
    x, w, b, r = (t.detach() for t in _inputs((4, 16, 24, 20), torch.bfloat16, CL))
    dy = torch.randn_like(x)
    first = _run_fwd_bwd(x, r, dy, w, b)
    for _ in range(2):
        for a, c in zip(first, _run_fwd_bwd(x, r, dy, w, b)):
            assert torch.equal(a, c)


# ---- module: running stats, state_dict, torch's errors ----

@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
def test_running_stats_track_batchnorm2d(interpret, momentum, fmt):
    ref = nn.BatchNorm2d(12, momentum=momentum)
    ours = BatchNormAct2d(12, momentum=momentum, activation="none")
    ours.load_state_dict(ref.state_dict())
    for step in range(4):
        x = (3.0 + step + torch.randn(3, 12, 5, 7)).contiguous(memory_format=fmt)
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    for name, t in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], t, rtol=1e-6, atol=1e-6)
    x = torch.randn(3, 12, 5, 7).contiguous(memory_format=fmt)
    torch.testing.assert_close(ours.eval()(x), ref.eval()(x), rtol=1e-5, atol=1e-5)


def test_state_dict_matches_batchnorm2d():
    ref, ours = nn.BatchNorm2d(7), BatchNormAct2d(7)
    torch.nn.init.normal_(ref.running_mean), torch.nn.init.normal_(ref.weight)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    assert torch.equal(ours.running_mean, ref.running_mean)
    shared = BatchNormAct2d.from_batchnorm(ref.eval(), activation="none")
    assert shared.weight is ref.weight and shared.running_var is ref.running_var
    assert shared.num_batches_tracked is ref.num_batches_tracked and not shared.training
    assert "activation='none'" in repr(shared)
    with pytest.raises(ValueError, match="activation must be one of"):
        BatchNormAct2d(4, activation="swish")


def test_track_running_stats_false_uses_batch_stats_in_eval(interpret):
    ref = nn.BatchNorm2d(6, track_running_stats=False).eval()
    ours = BatchNormAct2d(6, track_running_stats=False, activation="none").eval()
    x = torch.randn(2, 6, 4, 3)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_one_value_per_channel_raises_like_torch():
    x = torch.randn(1, 3, 1, 1)
    with pytest.raises(ValueError) as ours:
        BatchNormAct2d(3)(x)
    with pytest.raises(ValueError) as ref:
        nn.BatchNorm2d(3)(x)
    assert str(ours.value) == str(ref.value)
    assert BatchNormAct2d(3).eval()(x).shape == x.shape  # eval normalises a single value


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(x=torch.randn(2, 3, 4)), ValueError, "expected a 4-D"),
    (dict(weight=torch.ones(4)), ValueError, r"weight must have shape \(3,\)"),
    (dict(running_mean=torch.zeros(2), running_var=torch.ones(2)), ValueError, "running_mean"),
    (dict(x=torch.ones(2, 3, 4, 4, dtype=torch.int32)), TypeError, "x must be float32"),
    (dict(weight=torch.ones(3, device="meta")), RuntimeError, "one device"),
    (dict(eps=-1e-5), ValueError, "eps must be"),
    (dict(activation="gelu"), ValueError, "activation must be one of"),
    (dict(residual=torch.randn(2, 3, 4, 5)), ValueError, "residual must match"),
    (dict(training=False, running_mean=None, running_var=None), ValueError, "running_mean"),
])
def test_bad_input_errors(kwargs, error, match):
    args = dict(x=torch.randn(2, 3, 4, 4), weight=torch.ones(3), bias=torch.zeros(3),
                running_mean=torch.zeros(3), running_var=torch.ones(3), training=True)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        batch_norm_act(**args)


# ---- the plain-PyTorch reference path (CPU without the interpreter) ----

@pytest.fixture
def reference_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
def test_reference_path_gate(reference_path, fmt):
    _gate((2, 65, 5, 3), torch.bfloat16, fmt)
    _gate((2, 9, 4, 3), torch.float32, fmt, training=False)


def _module_step(module, x, r, dy):
    x, r = x.detach().requires_grad_(), r.detach().requires_grad_()
    y = module(x, r)
    y.backward(dy)
    return y.detach(), x.grad, r.grad, module.weight.grad


def _check_compiled_module(device):
    torch._dynamo.reset()
    eager, compiled = BatchNormAct2d(16).to(device), BatchNormAct2d(16).to(device)
    fn = torch.compile(compiled, fullgraph=True)
    for _ in range(2):
        x, _, _, r = (t.detach() for t in _inputs((4, 16, 6, 5), torch.float32, CL, device))
        dy = torch.randn_like(x)
        for a, c in zip(_module_step(eager, x, r, dy), _module_step(fn, x, r, dy)):
            torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5)
        eager.weight.grad = compiled.weight.grad = None
    for name, t in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], t)


def test_compiled_module_fullgraph_cpu(reference_path):
    _check_compiled_module("cpu")


def _opcheck_all(device):
    """Schema, fake implementation, autograd registration and AOT dispatch of the three ops
    (eager calls bypass them; torch.compile relies on them)."""
    x, w, b, r = _inputs((2, 5, 3, 4), torch.float32, CL, device)
    mean, rstd = batch_norm_stats(x.detach(), None, None, 0.1, 1e-5)
    running = (torch.zeros(5, device=device), torch.ones(5, device=device))
    apply_args = (x, mean, rstd, w, b, r, 1e-5, True, "relu")
    bits = batch_norm_act_apply(*apply_args)[1]
    bwd_args = (torch.randn_like(x), x.detach(), w.detach(), mean, rstd, bits, 1e-5, True,
                "relu", True)
    for op, args in ((batch_norm_stats, (x.detach(), *running, 0.1, 1e-5)),
                     (batch_norm_act_apply, apply_args), (batch_norm_act_backward, bwd_args)):
        torch.library.opcheck(op, args)


def test_custom_ops_opcheck(reference_path):
    _opcheck_all("cpu")


# ---- GPU lane ----

GPU_SHAPES = [(2, 1, 5, 7), (3, 3, 17, 9), (4, 65, 9, 11), (8, 64, 56, 56), (16, 256, 14, 14),
              (32, 2048, 7, 7)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_training_gate(shape, dtype, fmt):
    _gate(shape, dtype, fmt, device=CUDA)


@pytest.mark.gpu
@pytest.mark.parametrize(("training", "activation", "residual", "affine"), VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_variants_gate(training, activation, residual, affine, dtype):
    for fmt in (CL, CF):
        _gate((8, 96, 14, 14), dtype, fmt, device=CUDA, training=training,
              activation=activation, residual=residual, affine=affine)


@pytest.mark.gpu
def test_gpu_mean_far_from_zero():
    _gate((8, 64, 28, 28), torch.float32, CL, device=CUDA, offset=1000.0)


@pytest.mark.gpu
@pytest.mark.parametrize("momentum", [0.1, None])
def test_gpu_running_stats_track_batchnorm2d(momentum):
    ref = nn.BatchNorm2d(64, momentum=momentum).to(CUDA)
    ours = BatchNormAct2d.from_batchnorm(nn.BatchNorm2d(64, momentum=momentum).to(CUDA), "none")
    for step in range(5):
        x = (step + torch.randn(16, 64, 14, 14, device=CUDA)).contiguous(memory_format=CL)
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)
    for name, t in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], t, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_repeated_backward_bitwise_equal_50_times():
    x, w, b, r = (t.detach() for t in _inputs((32, 256, 14, 14), torch.bfloat16, CL, CUDA))
    dy = torch.randn_like(x)
    first = _run_fwd_bwd(x, r, dy, w, b)
    for _ in range(50):
        for a, c in zip(first, _run_fwd_bwd(x, r, dy, w, b)):
            assert torch.equal(a, c)


@pytest.mark.gpu
def test_gpu_compiled_module_fullgraph_and_opcheck():
    _check_compiled_module(CUDA)
    _opcheck_all(CUDA)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    bn, ref = BatchNormAct2d(64).to(CUDA), BatchNormAct2d(64).to(CUDA)
    x, _, _, r = (t.detach() for t in _inputs((8, 64, 14, 14), torch.bfloat16, CL, CUDA))
    x.requires_grad_()
    dy = torch.randn_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile kernels, size the reduction grids
        for _ in range(2):
            bn(x, r).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    bn.load_state_dict(ref.state_dict())
    x.grad = bn.weight.grad = bn.bias.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bn(x, r)
        y.backward(dy)
    for step in range(3):
        x.data.copy_(torch.randn_like(x) + step)
        graph.replay()
        xe = x.detach().clone().requires_grad_()
        ye = ref(xe, r)
        ye.backward(dy)
        torch.testing.assert_close(y, ye)
        torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)


@pytest.mark.gpu
def test_gpu_over_2_pow_31_elements():
    """Index arithmetic past 2^31 elements: statistics, and the rows stored last (offsets past
    2^31), forward and backward, against float32 PyTorch."""
    shape, eps = (2, 64, 4096, 4100), 1e-5  # 2.15e9 elements
    x = torch.randn(shape, device=CUDA, dtype=torch.bfloat16).contiguous(memory_format=CL)
    r, dy = torch.randn_like(x), torch.randn_like(x)
    w, b = 1 + torch.rand(64, device=CUDA), torch.randn(64, device=CUDA)
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    rstd = torch.rsqrt(var + eps)
    ours_mean, ours_rstd = batch_norm_stats(x, None, None, 0.1, eps)
    torch.testing.assert_close(ours_mean, mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours_rstd, rstd, rtol=1e-4, atol=1e-5)
    xg = x.detach().requires_grad_()
    y = batch_norm_act(xg, w, b, None, None, True, eps=eps, residual=r)
    y.backward(dy)
    channel = (1, -1, 1, 1)
    dz = dy.float() * (y > 0)
    db = dz.sum((0, 2, 3))
    dw = (dz * (x.float() - mean.view(channel))).sum((0, 2, 3)) * rstd
    tail = (slice(1, 2), slice(None), slice(-3, None), slice(None))  # stored last
    x_hat = (x[tail].float() - mean.view(channel)) * rstd.view(channel)
    y_ref = F.relu(x_hat * w.view(channel) + b.view(channel) + r[tail].float())
    n = x.numel() // 64
    dx_ref = (w * rstd).view(channel) * (dz[tail] - (db / n).view(channel)
                                         - x_hat * (dw / n).view(channel))
    torch.testing.assert_close(y[tail].float(), y_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(xg.grad[tail].float(), dx_ref, rtol=2e-2, atol=2e-2)
