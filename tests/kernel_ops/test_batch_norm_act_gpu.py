"""batch_norm_act on a CUDA GPU (run `pytest -m gpu` on the GPU machine): the numeric gate over
dtypes, layouts and shapes, running stats, determinism, torch.compile, CUDA graphs, > 2^31
elements, and the direct launcher (`_launch.Launch`); the smooth activations (SiLU, GELU,
Hardswish) at a realistic shape, last."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.kernels import _launch as runtime
from gpushape.kernels.batch_norm import _launch as launch
from gpushape.kernels.batch_norm.batch_norm_act import (
    BatchNormAct2d,
    batch_norm_act,
    batch_norm_stats,
)

from ._batch_norm_cases import (
    CF,
    CL,
    CUDA,
    SMOOTH,
    TORCH_ACT,
    VARIANTS,
    _check_compiled_module,
    _gate,
    _inputs,
    _opcheck_all,
    _run_fwd_bwd,
)

GPU_SHAPES = [
    (2, 1, 5, 7),
    (3, 3, 17, 9),
    (4, 65, 9, 11),
    (8, 64, 56, 56),
    (16, 256, 14, 14),
    (32, 2048, 7, 7),
]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_training_gate(shape, dtype, fmt):
    _gate(shape, dtype, fmt, device=CUDA)


@pytest.mark.gpu
@pytest.mark.parametrize(("training", "activation", "residual", "affine"), VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_variants_gate(training, activation, residual, affine, dtype):
    for fmt in (CL, CF):
        _gate(
            (8, 96, 14, 14),
            dtype,
            fmt,
            device=CUDA,
            training=training,
            activation=activation,
            residual=residual,
            affine=affine,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
def test_gpu_fp32_gate_over_fresh_draws(fmt):
    """Ten fresh draws at a ResNet-50 shape in fp32 (before the gate kept inputs off ReLU's kink,
    an fp32 rounding flip there failed this about one run in two)."""
    for _ in range(10):
        _gate((8, 64, 56, 56), torch.float32, fmt, device=CUDA)


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
    dx_ref = (w * rstd).view(channel) * (
        dz[tail] - (db / n).view(channel) - x_hat * (dw / n).view(channel)
    )
    torch.testing.assert_close(y[tail].float(), y_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(xg.grad[tail].float(), dx_ref, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_direct_launcher_equals_jit_launch():
    """After a kernel's first launch, later ones skip Triton's JIT dispatch: same bits."""
    x, w, b, r = (t.detach() for t in _inputs((16, 256, 14, 14), torch.bfloat16, CL, CUDA))
    dy = torch.randn_like(x)
    try:
        runtime.FAST_LAUNCH = False
        slow = _run_fwd_bwd(x, r, dy, w, b)
        runtime.FAST_LAUNCH = True
        _run_fwd_bwd(x, r, dy, w, b)
        fast = _run_fwd_bwd(x, r, dy, w, b)
        assert runtime.FAST_LAUNCH, "the direct launcher failed and switched itself off"
    finally:
        runtime.FAST_LAUNCH = True
    plan = launch.forward_plan(x, w, b, None, None, r, True, True)
    assert plan.apply_launch.runner is not None and plan.reduction.launch.runner is not None
    for a, c in zip(slow, fast):
        assert torch.equal(a, c)


@pytest.mark.gpu
def test_gpu_misaligned_input_after_aligned_ones():
    """A same-shape input 2 bytes off a 16-byte boundary (a plan built for aligned ones) goes
    through Triton's JIT, which specialises for it: no misaligned vector loads."""
    x, w, b, r = (t.detach() for t in _inputs((8, 64, 14, 14), torch.bfloat16, CL, CUDA))
    dy = torch.randn_like(x)
    expected = [_run_fwd_bwd(x, r, dy, w, b) for _ in range(2)][-1]
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=CUDA)
    x_off = buf.as_strided(x.shape, x.stride(), storage_offset=1)
    x_off.copy_(x)
    assert x_off.data_ptr() % 16 == 2 and x_off.stride() == x.stride()
    for a, c in zip(expected, _run_fwd_bwd(x_off, r, dy, w, b)):
        torch.testing.assert_close(c, a)


# ---- SiLU, GELU (erf, tanh), Hardswish: the pre-activation recomputed in the backward ----


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
@pytest.mark.parametrize("activation", SMOOTH)
def test_gpu_smooth_activation_gate_at_a_resnet_shape(activation, residual):
    """64x256x28x28 bf16 channels_last, training: forward and the gradients of x, weight, bias
    (and residual) against PyTorch's BatchNorm2d + add + activation."""
    _gate(
        (64, 256, 28, 28),
        torch.bfloat16,
        CL,
        device=CUDA,
        activation=activation,
        residual=residual,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("activation", SMOOTH)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
def test_gpu_smooth_activation_variants(activation, dtype):
    for fmt in (CL, CF):
        for training, residual, affine in ((True, False, False), (False, True, True)):
            _gate(
                (8, 97, 14, 14),
                dtype,
                fmt,
                device=CUDA,
                training=training,
                activation=activation,
                residual=residual,
                affine=affine,
            )
    _gate((32, 2048, 7, 7), dtype, CL, device=CUDA, activation=activation)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", SMOOTH)
def test_gpu_smooth_activation_module_tracks_torch(activation):
    """Running stats, outputs and gradients over steps against nn.BatchNorm2d + activation."""
    ref = nn.BatchNorm2d(64).to(CUDA)
    ours = BatchNormAct2d.from_batchnorm(nn.BatchNorm2d(64).to(CUDA), activation)
    for step in range(4):
        x = (step + torch.randn(16, 64, 14, 14, device=CUDA)).contiguous(memory_format=CL)
        xs = [x.clone().requires_grad_() for _ in range(2)]
        y_ref, y = TORCH_ACT[activation](ref(xs[0])), ours(xs[1])
        dy = torch.randn_like(y)
        y_ref.backward(dy), y.backward(dy)
        torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-3, atol=1e-4)
    for name, t in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], t, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_smooth_activation_compile_opcheck_determinism_and_graphs():
    _check_compiled_module(CUDA, "silu")
    for activation in SMOOTH:
        _opcheck_all(CUDA, activation)
    x, w, b, r = (t.detach() for t in _inputs((32, 256, 14, 14), torch.bfloat16, CL, CUDA))
    dy = torch.randn_like(x)
    first = _run_fwd_bwd(x, r, dy, w, b, "gelu")
    for _ in range(20):
        for a, c in zip(first, _run_fwd_bwd(x, r, dy, w, b, "gelu")):
            assert torch.equal(a, c)
    bn = BatchNormAct2d(64, activation="hardswish").to(CUDA)
    x, _, _, r = (t.detach() for t in _inputs((8, 64, 14, 14), torch.bfloat16, CL, CUDA))
    x.requires_grad_()
    dy = torch.randn_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile kernels, size the reduction grids
        for _ in range(2):
            bn(x, r).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bn(x, r)
        y.backward(dy)
    graph.replay()
    xe = x.detach().clone().requires_grad_()
    ye = bn(xe, r)  # the same batch: the same statistics, whatever the running stats hold
    ye.backward(dy)
    torch.testing.assert_close(y, ye)
    torch.testing.assert_close(x.grad, xe.grad)
