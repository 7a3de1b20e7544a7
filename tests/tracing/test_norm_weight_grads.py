"""A LayerNorm backward's weight gradients (tracing/norm_grads.py): PyTorch's split path over
many rows of few columns, its one-block-per-32-columns path otherwise, and how each is priced."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import gpushape
from gpushape.hardware import get_gpu
from gpushape.hardware.profile import calibrated
from gpushape.tracing.cost import op_cost
from gpushape.tracing.flops.registry import op_work
from gpushape.tracing.norm_grads import columns_time_s, weight_grad_pass

H200 = get_gpu("h200")  # 132 SMs


def _backward(rows: int, cols: int, affine: bool = True, norm=nn.LayerNorm):
    x = torch.empty(rows, cols, device="meta", dtype=torch.bfloat16, requires_grad=True)
    module = norm(cols, elementwise_affine=affine) if norm is nn.LayerNorm else norm(4, cols)
    trace = gpushape.trace(module.to("meta", torch.bfloat16), (x,), train=True)
    (rec,) = [r for r in trace.ops if r.name.endswith("norm_backward")]
    return rec


def _with(spec, **families):
    return spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency=families))


@pytest.mark.parametrize(
    ("rows", "cols", "split"),
    [
        (50176, 192, False),  # ConvNeXt-T's and Swin-T's second stage: 64 x 28 x 28 rows
        (8192, 768, False),  # BERT-base at 16 x 512 tokens
        (200704, 96, True),  # their first stage: over 64 x 1024 rows
        (131072, 4224, False),  # 132 blocks of 32 columns: not fewer than half the SMs
    ],
)
def test_the_path_follows_pytorchs_rows_and_columns_rule(rows, cols, split):
    grads = weight_grad_pass(_backward(rows, cols), H200.sm_count)
    assert (grads.rows, grads.cols, grads.split) == (rows, cols, split)
    assert grads.nbytes == 2 * rows * cols * 2  # dy and x, bf16


def test_no_weight_gradient_no_second_kernel():
    rec = _backward(50176, 192, affine=False)
    assert weight_grad_pass(rec, H200.sm_count) is None
    assert op_work(rec).reread_bytes == 0
    assert op_cost(rec, H200).weight_grad_s == 0.0


def test_the_weight_gradients_read_dy_and_x_again():
    rec = _backward(50176, 192)
    assert op_work(rec).reread_bytes == 2 * 50176 * 192 * 2


def test_group_norm_reads_x_once():
    assert op_work(_backward(64, 192, norm=nn.GroupNorm)).reread_bytes == 0


def test_the_columns_kernel_streams_a_strip_per_sm():
    rec = _backward(50176, 192)
    share = H200.attainable_bandwidth_bytes_per_s() / H200.sm_count
    expected = 50176 * 32 * 2 * 2 / share  # one block's 32 columns of dy and x, one wave
    assert op_cost(rec, H200).weight_grad_s == pytest.approx(expected)
    assert op_cost(rec, _with(H200, norm_weight_grad=2.0)).weight_grad_s == pytest.approx(
        expected / 2
    )


def test_the_columns_time_depends_on_the_rows_until_the_blocks_fill_a_wave():
    times = {cols: op_cost(_backward(12544, cols), H200).weight_grad_s for cols in (96, 384, 768)}
    assert times[96] == pytest.approx(times[768])
    wide = H200.sm_count * 32 + 32  # one block more than a wave
    grads = weight_grad_pass(_backward(12544, wide), H200.sm_count)
    assert columns_time_s(grads, H200) == pytest.approx(2 * times[96])


def test_the_columns_kernel_takes_its_bytes_out_of_the_norms_memory_time():
    rec = _backward(50176, 192)
    work = op_work(rec)
    measured = _with(H200, norm=0.5)
    cost = op_cost(rec, measured)
    rate = H200.attainable_bandwidth_bytes_per_s() * 0.5
    assert cost.memory_s == pytest.approx(work.min_bytes / rate)  # the re-read is not here
    assert cost.kernel_time_s == pytest.approx(
        max(cost.compute_s, cost.memory_s) + cost.weight_grad_s
    )


def test_the_split_path_rereads_at_the_norms_rate():
    rec = _backward(200704, 96)
    work = op_work(rec)
    cost = op_cost(rec, _with(H200, norm=0.5))
    rate = H200.attainable_bandwidth_bytes_per_s() * 0.5
    assert cost.weight_grad_s == 0.0
    assert cost.memory_s == pytest.approx((work.min_bytes + work.reread_bytes) / rate)


def test_a_second_stage_layer_norm_prices_near_its_h200_measurement():
    """ConvNeXt-T's LayerNorms over 64 x 28 x 28 rows of 192 took 0.324 ms a module on the H200
    (forward and backward; benchmarks/results/correlate-h200/correlate-lib.json); priced at the
    shipped profile's rates, their rows alone came to 0.13 ms."""
    x = torch.empty(64, 28, 28, 192, device="meta", dtype=torch.bfloat16, requires_grad=True)
    trace = gpushape.trace(nn.LayerNorm(192).to("meta", torch.bfloat16), (x,), train=True)
    ops = [op_cost(r, calibrated(H200)) for r in trace.ops]
    total = sum(c.kernel_time_s for c in ops)
    assert 0.8 < total / 0.324e-3 < 1.25
    assert sum(c.kernel_time_s - c.weight_grad_s for c in ops) < 0.5 * total
