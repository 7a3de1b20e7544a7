"""batch_norm_act with SiLU, GELU (erf and tanh) and Hardswish against PyTorch's BatchNorm2d
+ add + F.silu / F.gelu / F.hardswish (CPU lane, TRITON_INTERPRET=1: small shapes).

Their backward recomputes the pre-activation from x, the statistics, weight, bias and the
residual (`_act_bwd_kernels.py`): each gradient (x, weight, bias, residual) is gated
separately, with and without a residual, in training and eval, channels_last and NCHW. ReLU's
path: test_batch_norm_act.py; GPU lane: test_batch_norm_act_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.kernels.batch_norm import _launch as launch
from gpushape.kernels.batch_norm._tuning import batch_norm_tuning
from gpushape.kernels.batch_norm.batch_norm_act import BatchNormAct2d, batch_norm_act

from ._batch_norm_cases import (
    CF,
    CL,
    KINKS,
    SMOOTH,
    TORCH_ACT,
    _check_compiled_module,
    _gate,
    _inputs,
    _keep_off_kinks,
    _opcheck_all,
    _run_fwd_bwd,
)
from .test_batch_norm_act_tuning import EDGE

FMTS = pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
ACTS = pytest.mark.parametrize("activation", SMOOTH)

# ---- numeric gate: forward and every gradient, Triton kernels in the interpreter ----


@ACTS
@FMTS
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
def test_training_gate(interpret, activation, fmt, residual):
    _gate((2, 13, 5, 3), torch.float32, fmt, activation=activation, residual=residual)


@ACTS
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
def test_eval_gate(interpret, activation, residual):
    _gate((2, 9, 4, 3), torch.float32, CL, training=False, activation=activation, residual=residual)


@ACTS
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
def test_bf16_gate(interpret, activation, residual):
    """bf16: with a residual dz is rounded to bf16 (it is the residual's gradient), as in
    PyTorch's own backward; without one it stays fp32."""
    _gate((2, 21, 4, 5), torch.bfloat16, CL, activation=activation, residual=residual)


# One channel: dweight and dbias are one fp32 sum each, of dz whose precision follows the fp32
# statistics (a smooth derivative, unlike ReLU's, moves with h); PyTorch's CPU BatchNorm keeps
# its statistics in double, so its own error there can be ~0, and one channel leaves the max
# nothing to average: such draws need up to ~2 units of the gate's slack (measured over 600
# draws; 13 channels and more stay under 0.15). On the GPU PyTorch's statistics are fp32 too.
SINGLE_CHANNEL_TINY_UNITS = 4.0


@pytest.mark.parametrize("shape", [(3, 1, 5, 7), (2, 65, 5, 3), (4, 16, 24, 20)], ids=str)
def test_odd_channels_and_larger_tiles(interpret, shape):
    units = SINGLE_CHANNEL_TINY_UNITS if shape[1] == 1 else 1.0
    for activation, fmt in (("silu", CL), ("hardswish", CF)):
        _gate(shape, torch.float32, fmt, activation=activation, tiny_units=units)


def test_fp16_nchw_without_affine_and_far_mean(interpret):
    _gate((2, 24, 5, 6), torch.float16, CF, activation="gelu", affine=False)
    _gate((4, 16, 6, 5), torch.float32, CL, activation="silu", offset=1000.0)


@ACTS
def test_gradcheck_float64(interpret, activation):
    x, w, b, r = (
        t.detach().double().requires_grad_() for t in _inputs((2, 3, 2, 3), torch.float64, CL)
    )
    for training in (True, False):
        rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        if activation in KINKS:  # finite differences across a kink are not the derivative
            _keep_off_kinks(x, w, b, r, training, (rm, rv), KINKS[activation])

        def fn(x, w, b, r, training=training, rm=rm, rv=rv):
            return batch_norm_act(
                x, w, b, rm.clone(), rv.clone(), training, activation=activation, residual=r
            )

        assert torch.autograd.gradcheck(fn, (x, w, b, r), atol=1e-6, fast_mode=True)


# ---- launch configurations: looping programs, separate finalize, several programs ----


@pytest.mark.parametrize("name", list(EDGE))
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
def test_edge_configurations_pass_the_gate(interpret, name, residual):
    with batch_norm_tuning(EDGE[name]):
        for fmt in (CL, CF):
            _gate((3, 21, 5, 7), torch.float32, fmt, activation="gelu", residual=residual)


def test_plans_per_activation_and_looping_programs_agree(interpret):
    x, w, b, r = (t.detach() for t in _inputs((4, 24, 6, 5), torch.bfloat16, CL))
    plan = launch.forward_plan(x, w, b, None, None, r, True, False, 1)
    assert launch.forward_plan(x, w, b, None, None, r, True, False, 2) is not plan
    assert launch.forward_plan(x, w, b, None, None, r, True, True) is not plan
    dy = torch.randn_like(x)
    one = EDGE["narrow"].bwd_apply.__class__(tile_bytes=512)
    with batch_norm_tuning(apply=one, bwd_apply=one):
        expected = _run_fwd_bwd(x, r, dy, w, b, "silu")
    loop = EDGE["narrow"].bwd_apply.__class__(tile_bytes=512, waves=1)
    with batch_norm_tuning(apply=loop, bwd_apply=loop):
        got = _run_fwd_bwd(x, r, dy, w, b, "silu")
    for a, c in zip(expected, got):
        assert torch.equal(a, c)


# ---- module: running stats, what the backward keeps, special values ----


@ACTS
@pytest.mark.parametrize("momentum", [0.1, None])
def test_module_tracks_batchnorm2d_then_activation(interpret, activation, momentum):
    """Outputs, every gradient and the running stats over steps, train then eval."""
    ref = nn.BatchNorm2d(11, momentum=momentum)
    ours = BatchNormAct2d(11, momentum=momentum, activation=activation)
    nn.init.normal_(ref.weight, 1.0, 0.3), nn.init.normal_(ref.bias, 0.0, 0.2)
    ours.load_state_dict(ref.state_dict())
    for step, fmt in enumerate((CL, CF, CL)):
        x = (1.0 + step + torch.randn(3, 11, 5, 4)).contiguous(memory_format=fmt)
        r = torch.randn(3, 11, 5, 4)
        dy = torch.randn(3, 11, 5, 4)
        xs = [x.clone().requires_grad_() for _ in range(2)]
        rs = [r.clone().requires_grad_() for _ in range(2)]
        y_ref, y = TORCH_ACT[activation](ref(xs[0]) + rs[0]), ours(xs[1], rs[1])
        y_ref.backward(dy), y.backward(dy)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        for a, c in ((xs[1], xs[0]), (rs[1], rs[0]), (ours.weight, ref.weight)):
            torch.testing.assert_close(a.grad, c.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-5)
    for name, t in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], t, rtol=1e-6, atol=1e-6)
    x = torch.randn(2, 11, 3, 3)
    torch.testing.assert_close(
        ours.eval()(x), TORCH_ACT[activation](ref.eval()(x)), rtol=1e-5, atol=1e-5
    )


def test_the_backward_keeps_the_residual_not_a_mask(interpret):
    """SiLU keeps bias and the residual (by reference) and writes no mask; ReLU keeps its
    mask and not the residual (its memory unchanged)."""
    x, w, b, r = _inputs((2, 9, 3, 4), torch.float32, CL)
    saved = {}
    for activation in ("silu", "relu"):
        y = batch_norm_act(x, w, b, None, None, True, activation=activation, residual=r)
        saved[activation] = y.grad_fn.saved_tensors
    ptrs = {a: {t.data_ptr() for t in ts if t is not None} for a, ts in saved.items()}
    assert r.data_ptr() in ptrs["silu"] and b.data_ptr() in ptrs["silu"]
    assert r.data_ptr() not in ptrs["relu"] and b.data_ptr() not in ptrs["relu"]
    assert not [t for t in saved["silu"] if t is not None and t.dtype == torch.uint8 and t.numel()]


def test_a_residual_without_grad_and_inplace_change_after_forward(interpret):
    x, w, b, r = _inputs((2, 6, 4, 3), torch.float32, CL)
    r = r.detach()
    y = batch_norm_act(x, w, b, None, None, True, activation="hardswish", residual=r)
    (gx,) = torch.autograd.grad(y, x, torch.randn_like(y), retain_graph=True)
    ref = TORCH_ACT["hardswish"](torch.nn.functional.batch_norm(x, None, None, w, b, True) + r)
    (gx_ref,) = torch.autograd.grad(ref, x, torch.ones_like(ref) * 0 + 1)
    assert gx.shape == gx_ref.shape
    r.add_(1.0)  # the backward reads the residual: autograd must refuse a changed one
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@ACTS
def test_nan_propagates_like_torch(interpret, activation):
    x, w, b, r = (t.detach() for t in _inputs((2, 4, 3, 3), torch.float32, CL))
    x[1, 2, 0, 1] = float("nan")
    r[0, 0, 1, 1] = float("nan")
    for training in (True, False):
        rm, rv = torch.zeros(4), torch.ones(4)
        ours = batch_norm_act(
            x, w, b, rm.clone(), rv.clone(), training, activation=activation, residual=r
        )
        ref = torch.nn.functional.batch_norm(x, rm, rv, w, b, training) + r
        assert torch.equal(torch.isnan(ours), torch.isnan(TORCH_ACT[activation](ref)))


def test_empty_batch_and_repeated_backward(interpret):
    bn = BatchNormAct2d(5, activation="gelu")
    x = torch.randn(0, 5, 4, 4, requires_grad=True).contiguous(memory_format=CL)
    y = bn(x, torch.randn(0, 5, 4, 4))
    y.sum().backward()
    assert y.shape == x.shape and bn.weight.grad.abs().sum() == 0
    x, w, b, r = (t.detach() for t in _inputs((4, 16, 12, 10), torch.bfloat16, CL))
    dy = torch.randn_like(x)
    first = _run_fwd_bwd(x, r, dy, w, b, "gelu_tanh")
    for a, c in zip(first, _run_fwd_bwd(x, r, dy, w, b, "gelu_tanh")):
        assert torch.equal(a, c)


@pytest.mark.parametrize("bad", ["swish", "GELU", "gelu_new", ""])
def test_unknown_activation_is_a_one_line_value_error(bad):
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(ValueError, match="activation must be one of") as err:
        batch_norm_act(x, None, None, None, None, True, activation=bad)
    assert "\n" not in str(err.value) and "hardswish" in str(err.value)
    with pytest.raises(ValueError, match="activation must be one of") as err:
        BatchNormAct2d(3, activation=bad)
    assert "\n" not in str(err.value)


# ---- the plain-PyTorch reference path and torch.compile (CPU without the interpreter) ----


@pytest.fixture
def reference_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@ACTS
def test_reference_path_gate(reference_path, activation):
    _gate((2, 13, 5, 3), torch.bfloat16, CF, activation=activation)
    _gate((2, 9, 4, 3), torch.float32, CL, activation=activation, training=False, residual=False)


def test_compiled_module_fullgraph_and_opcheck(reference_path):
    _check_compiled_module("cpu", "silu")
    for activation in SMOOTH:
        _opcheck_all("cpu", activation)
