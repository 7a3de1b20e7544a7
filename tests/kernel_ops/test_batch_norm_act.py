"""batch_norm_act / BatchNormAct2d against PyTorch's BatchNorm2d + add + ReLU (CPU lane).

TRITON_INTERPRET=1 runs the Triton kernels on small shapes (the `interpret` fixture); tests that
pin the plain-PyTorch reference path unset it. GPU lane: test_batch_norm_act_gpu.py; launch
plans and configurations: test_batch_norm_act_tuning.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.kernels.batch_norm.batch_norm_act import (
    BatchNormAct2d,
    batch_norm_act,
    batch_norm_act_apply,
    batch_norm_stats,
)

from ._batch_norm_cases import (
    CF,
    CL,
    KINK,
    VARIANTS,
    _check_compiled_module,
    _gate,
    _inputs,
    _keep_off_relu_kink,
    _opcheck_all,
    _pre_activation64,
    _run_fwd_bwd,
    _torch_composition,
)

# ---- numeric gate, Triton kernels in the interpreter ----

GATE_SHAPES = [(3, 1, 5, 7), (2, 3, 7, 5), (2, 63, 3, 5), (2, 65, 5, 3), (4, 16, 24, 20)]


@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", GATE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_training_relu_residual_gate(interpret, shape, dtype, fmt):
    _gate(shape, dtype, fmt)


@pytest.mark.parametrize(("training", "activation", "residual", "affine"), VARIANTS)
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
def test_variants_gate(interpret, training, activation, residual, affine, fmt):
    _gate(
        (2, 10, 6, 7),
        torch.float32,
        fmt,
        training=training,
        activation=activation,
        residual=residual,
        affine=affine,
    )


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_gate_inputs_keep_off_relu_kink(residual, training):
    """The gate's inputs are moved off ReLU's kink (where fp32 rounding alone may flip an
    element's gradient), through the residual when there is one, leaving x untouched then."""
    x, w, b, r = _inputs((2, 6, 5, 4), torch.float32, CL, residual=residual)
    running = (0.1 * torch.randn(6), 0.5 + torch.rand(6))
    target = r if residual else x
    with torch.no_grad():  # plant pre-activations 1e-7 from the kink (x moves the stats: iterate)
        for _ in range(4):
            z = _pre_activation64(x, w, b, r, training, running)
            gain = (
                1.0
                if residual
                else (
                    w.double()
                    * torch.rsqrt(
                        (
                            x.double().var(dim=(0, 2, 3), correction=0)
                            if training
                            else running[1].double()
                        )
                        + 1e-5
                    )
                )[3]
            )
            target[0, 3, 1, 1] -= float((z[0, 3, 1, 1] - 1e-7) / gain)
            target[1, 3, 2, 0] -= float((z[1, 3, 2, 0] + 1e-7) / gain)
    assert (_pre_activation64(x, w, b, r, training, running).abs() < KINK).sum() >= 1
    x_before = x.detach().clone()
    _keep_off_relu_kink(x, w, b, r, training, running)
    assert (_pre_activation64(x, w, b, r, training, running).abs() >= KINK).all()
    if residual:
        assert torch.equal(x.detach(), x_before)


def test_fp16_gate(interpret):
    _gate((2, 24, 5, 6), torch.float16, CL)


def test_mean_far_from_zero(interpret):
    """1000 + N(0, 1): a one-pass sum of squares would lose every digit of the variance."""
    _gate((4, 16, 24, 20), torch.float32, CL, offset=1000.0)


def test_gradcheck_float64(interpret):
    x, w, b, r = (
        t.detach().double().requires_grad_() for t in _inputs((2, 3, 2, 3), torch.float64, CL)
    )
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


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(x=torch.randn(2, 3, 4)), ValueError, "expected a 4-D"),
        (dict(weight=torch.ones(4)), ValueError, r"weight must have shape \(3,\)"),
        (dict(running_mean=torch.zeros(2), running_var=torch.ones(2)), ValueError, "running_mean"),
        (dict(x=torch.ones(2, 3, 4, 4, dtype=torch.int32)), TypeError, "x must be float32"),
        (dict(weight=torch.ones(3, device="meta")), RuntimeError, "one device"),
        (dict(eps=-1e-5), ValueError, "eps must be"),
        (dict(activation="swish"), ValueError, "activation must be one of"),
        (dict(residual=torch.randn(2, 3, 4, 5)), ValueError, "residual must match"),
        (dict(training=False, running_mean=None, running_var=None), ValueError, "running_mean"),
    ],
)
def test_bad_input_errors(kwargs, error, match):
    args = dict(
        x=torch.randn(2, 3, 4, 4),
        weight=torch.ones(3),
        bias=torch.zeros(3),
        running_mean=torch.zeros(3),
        running_var=torch.ones(3),
        training=True,
    )
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


def test_compiled_module_fullgraph_cpu(reference_path):
    _check_compiled_module("cpu")


def test_custom_ops_opcheck(reference_path):
    _opcheck_all("cpu")
