"""batch_norm_act's one-kernel-a-direction path (training, channels_last, L2-resident channel
groups: `_batch_norm_grouped.py`), CPU lane in the interpreter.

The interpreter runs one program (P = 1: programs there run one after another, so none may wait
on another); the GPU lane (test_batch_norm_act_gpu.py) runs the same path with every SM's
programs waiting on each other.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpushape.kernels import _batch_norm_launch as launch
from gpushape.kernels import _batch_norm_runtime as runtime
from gpushape.kernels._batch_norm_grouped_plans import group_width
from gpushape.kernels._batch_norm_plans import View
from gpushape.kernels._batch_norm_tuning import GroupedConfig, batch_norm_tuning

from ._batch_norm_cases import CF, CL, _gate, _inputs, _run_fwd_bwd

FORCE = GroupedConfig(force=True, block_c=16, block_l=8)


def _plans(x, w, b, r, relu=True):
    fwd = launch.grouped_forward_plan(x, w, b, None, r, relu)
    bwd = launch.backward_plan(x, w, torch.empty(x.shape[1]), True, relu, r is not None)
    return fwd, bwd.grouped


@pytest.mark.parametrize("shape", [(3, 21, 5, 7), (2, 40, 3, 3), (1, 8, 1, 9), (5, 3, 2, 2)])
@pytest.mark.parametrize("lag", [0, 1])
def test_grouped_path_passes_the_gate(interpret, shape, lag):
    """C above, below and equal to a group; rows not a multiple of the tile; one and two groups
    in flight."""
    with batch_norm_tuning(grouped=dataclasses.replace(FORCE, lag=lag)):
        x, w, b, r = (t.detach() for t in _inputs(shape, torch.float32, CL))
        fwd, bwd = _plans(x, w, b, r)
        if View.of(x).channels_last:
            assert fwd is not None and bwd is not None and fwd.P == 1
        _gate(shape, torch.float32, CL)


@pytest.mark.parametrize("variant", [
    dict(activation="none", residual=True), dict(activation="relu", residual=False),
    dict(activation="none", residual=False, affine=False)])
def test_grouped_variants_pass_the_gate(interpret, variant):
    with batch_norm_tuning(grouped=FORCE):
        _gate((2, 24, 4, 5), torch.float32, CL, **variant)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_half_precision_gate(interpret, dtype):
    with batch_norm_tuning(grouped=FORCE):
        _gate((4, 32, 5, 3), dtype, CL)


def test_grouped_equals_two_kernel_path_and_repeats_bitwise(interpret):
    """Same op as the two-kernel path (to rounding: the sums run in another order), bitwise
    equal to itself call after call, and the sync counters end at zero."""
    x, w, b, r = (t.detach() for t in _inputs((4, 24, 6, 5), torch.float32, CL))
    dy = torch.randn_like(x)
    with batch_norm_tuning(grouped=GroupedConfig(enabled=False)):
        assert _plans(x, w, b, r) == (None, None)
        expected = _run_fwd_bwd(x, r, dy, w, b)
    with batch_norm_tuning(grouped=FORCE):
        first = _run_fwd_bwd(x, r, dy, w, b)
        again = _run_fwd_bwd(x, r, dy, w, b)
    for a, c, e in zip(first, again, expected):
        assert torch.equal(a, c)
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    assert not runtime.counters(x, 1).any()


def test_grouped_running_stats_track_batchnorm2d(interpret):
    x = (torch.randn(4, 24, 5, 5) * 2 + 1).to(memory_format=CL)
    ref = torch.nn.BatchNorm2d(24, momentum=0.3)
    rm, rv = ref.running_mean.clone(), ref.running_var.clone()
    with batch_norm_tuning(grouped=FORCE):
        from gpushape.kernels.batch_norm_act import batch_norm_act
        batch_norm_act(x, ref.weight, ref.bias, rm, rv, True, 0.3, 1e-5, "none")
    ref(x)
    torch.testing.assert_close(rm, ref.running_mean)
    torch.testing.assert_close(rv, ref.running_var)


def test_nchw_eval_and_unfitting_groups_take_the_two_kernel_path(interpret):
    x, w, b, r = (t.detach() for t in _inputs((2, 16, 4, 4), torch.float32, CF))
    with batch_norm_tuning(grouped=FORCE):
        assert _plans(x, w, b, r) == (None, None)  # NCHW
        xc = x.to(memory_format=CL)
        plan = launch.backward_plan(xc, w, torch.empty(16), False, True, True)
        assert plan.grouped is None  # eval
    # without force, the interpreter has no L2 to fit a group in
    assert _plans(x.to(memory_format=CL), w, b, r) == (None, None)


def test_group_width_halves_until_the_groups_fit():
    view = View(True, 1024, 50176, 50176, 128)  # ResNet-50 stage 4 at batch 256
    cfg = GroupedConfig(block_c=128, min_block_c=32, lag=1, l2_share=0.5)
    l2 = 60 * 2**20
    # forward holds x: 2 groups * 128 ch * 50176 rows * 2 B = 25.7 MB > 30 MB? no: fits
    assert group_width(view, cfg, 2, l2) == 128
    # backward holds dy, x and bits: 128 -> 64 (26 MB) fits 30 MB
    assert group_width(view, cfg, 4.125, l2) == 64
    assert group_width(view, cfg, 4.125, 8 * 2**20) is None  # not even 32 channels fit
    assert group_width(view, dataclasses.replace(cfg, force=True), 4.125, 0) == 128
    assert group_width(view, dataclasses.replace(cfg, enabled=False), 2, l2) is None
    narrow = View(True, 3, 10, 10, 1)
    assert group_width(narrow, dataclasses.replace(cfg, force=True), 2, 0) == 8
