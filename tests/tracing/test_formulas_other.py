"""Norms, softmax, dropout, pooling, embedding, gathers and scatters, views, elementwise ops.

FLOP counts follow the per-element tables in flops_norm.py / flops_memory.py; bytes are counted
here by hand from the shapes: every input read once, every output written once.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, nbytes, only, ops_named, trace_fn, work
from torch import nn

import gpushape

N, C, HW = 4, 8, 6  # (N, C, H, W) = (4, 8, 6, 6)
X = N * C * HW * HW


def test_batch_norm_train_and_eval():
    with torch.device("meta"):
        bn = nn.BatchNorm2d(C)
    x = (meta(N, C, HW, HW),)
    train = only(gpushape.trace(bn, x, train=True), "native_batch_norm")
    evals = only(gpushape.trace(bn, x), "native_batch_norm")
    assert work(train).flops == (5 + 2) * X and work(train).kernels == 2
    assert work(evals).flops == (2 + 2) * X and work(evals).kernels == 1
    # x read, y written; weight, bias, running mean and var read; save_mean, save_invstd written
    assert work(train).min_bytes == 2 * nbytes(X) + 4 * nbytes(C) + 2 * nbytes(C)


def test_batch_norm_backward():
    with torch.device("meta"):
        bn = nn.BatchNorm2d(C)
    t = gpushape.trace(bn, (meta(N, C, HW, HW, requires_grad=True),), train=True)
    bwd = only(t, "native_batch_norm_backward")
    assert work(bwd).flops == (8 + 3) * X and bwd.module_type == "BatchNorm2d"


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_forward_and_backward(affine):
    with torch.device("meta"):
        ln = nn.LayerNorm(32, elementwise_affine=affine)
    t = gpushape.trace(ln, (meta(5, 7, 32, requires_grad=True),), train=True)
    n = 5 * 7 * 32
    fwd, bwd = only(t, "native_layer_norm"), only(t, "native_layer_norm_backward")
    assert work(fwd).flops == (5 + (2 if affine else 0)) * n
    assert work(bwd).flops == (8 + (3 if affine else 0)) * n
    # x read (+ weight, bias); y, mean, rstd (one per row) written
    params = 2 * nbytes(32) if affine else 0
    assert work(fwd).min_bytes == 2 * nbytes(n) + params + 2 * nbytes(5 * 7)


def test_group_norm():
    with torch.device("meta"):
        gn = nn.GroupNorm(2, C)
    fwd = only(gpushape.trace(gn, (meta(N, C, HW, HW),)), "native_group_norm")
    assert work(fwd).flops == 7 * X


@pytest.mark.parametrize("fn,name", [(F.softmax, "_softmax"), (F.log_softmax, "_log_softmax")])
def test_softmax_forward_and_backward(fn, name):
    t = trace_fn(lambda x: fn(x, dim=-1), (meta(6, 10, requires_grad=True),), train=True)
    assert work(only(t, name)).flops == 5 * 60
    assert work(only(t, name)).min_bytes == 2 * nbytes(60)
    assert work(only(t, f"{name}_backward_data")).flops == 4 * 60


def test_dropout_train_keeps_a_mask_and_eval_is_gone():
    with torch.device("meta"):
        drop = nn.Dropout(0.1)
    x = (meta(10, 20, requires_grad=True),)
    t = gpushape.trace(drop, x, train=True)
    fwd = only(t, "native_dropout")
    assert work(fwd).flops == 2 * 200
    assert work(fwd).min_bytes == 2 * nbytes(200) + 200  # x read, y written, bool mask written
    assert work(only(t, "native_dropout_backward")).flops == 200
    assert not [op for op in gpushape.trace(drop, x).ops if op.kind == "compute"]


@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (2, 2, 0)])
def test_max_and_avg_pool(kernel, stride, padding):
    real = F.max_pool2d(torch.ones(N, C, HW, HW), kernel, stride, padding)
    taps = kernel * kernel
    t = trace_fn(
        lambda x: (
            F.max_pool2d(x, kernel, stride, padding),
            F.avg_pool2d(x, kernel, stride, padding),
        ),
        (meta(N, C, HW, HW, requires_grad=True),),
        train=True,
    )
    mx = only(t, "max_pool2d_with_indices")
    assert work(mx).flops == real.numel() * taps  # one comparison per tap per output
    # x read; y written; int64 indices written
    assert work(mx).min_bytes == nbytes(X) + nbytes(real.numel()) + real.numel() * 8
    assert work(only(t, "avg_pool2d")).flops == real.numel() * taps
    mx_bwd = only(t, "max_pool2d_with_indices_backward")
    # grad_output and indices read, grad_input written; the forward input is not read
    assert work(mx_bwd).min_bytes == nbytes(real.numel()) + real.numel() * 8 + nbytes(X)


def test_adaptive_avg_pool_to_one_is_a_mean():
    with torch.device("meta"):
        pool = nn.AdaptiveAvgPool2d(1)
    t = gpushape.trace(pool, (meta(N, C, HW, HW),))
    assert work(only(t, "mean")).flops == X  # a reduction: one add per input element


def test_embedding_reads_only_the_selected_rows():
    with torch.device("meta"):
        emb = nn.Embedding(50_000, 64, dtype=torch.bfloat16)
    ids = torch.empty(4, 16, dtype=torch.int64, device="meta")
    t = gpushape.trace(emb, (ids,), train=True)
    fwd = only(t, "embedding")
    rows = 4 * 16 * 64 * 2
    assert work(fwd).flops == 0
    assert work(fwd).min_bytes == 4 * 16 * 8 + rows + rows  # ids; rows read; output written
    bwd = only(t, "embedding_dense_backward")
    assert work(bwd).flops == 4 * 16 * 64
    assert work(bwd).min_bytes == rows + 4 * 16 * 8 + 50_000 * 64 * 2  # the dense table gradient


def test_gather_index_select_and_scatter_add():
    t = trace_fn(
        lambda x, idx, src: (
            torch.gather(x, 1, idx),
            x.index_select(0, idx[:, 0]),
            x.clone().scatter_add_(1, idx, src),
        ),
        (meta(100, 50), torch.empty(100, 3, dtype=torch.int64, device="meta"), meta(100, 3)),
    )
    gather = only(t, "gather")
    assert work(gather).min_bytes == 300 * 8 + nbytes(300) + nbytes(300)
    select = only(t, "index_select")
    assert work(select).min_bytes == 100 * 8 + nbytes(100 * 50) + nbytes(100 * 50)
    scatter = only(t, "scatter_add_")
    assert scatter.inplace and work(scatter).flops == 300
    # index + src read; 300 touched elements read and written (accumulate)
    assert work(scatter).min_bytes == 300 * 8 + nbytes(300) + 2 * nbytes(300)


def test_views_cost_nothing_and_elementwise_counts_one_per_element():
    t = trace_fn(
        lambda x, y: (x.view(6, 4).t().contiguous() + y.T).sum(dim=0), (meta(4, 6), meta(6, 4))
    )
    views = [op for op in t.ops if op.kind == "view"]
    assert {op.name for op in views} >= {"view", "t"}
    assert all(
        work(op).flops == 0 and work(op).min_bytes == 0 and work(op).kernels == 0 for op in views
    )
    (add,) = ops_named(t, "add")
    assert work(add).flops == 24 and work(add).min_bytes == 3 * nbytes(24)
    assert work(only(t, "clone")).flops == 0 and work(only(t, "clone")).min_bytes == 2 * nbytes(24)
    assert work(only(t, "sum")).flops == 24  # one add per input element


def test_broadcast_and_repeated_inputs_are_read_once():
    t = trace_fn(lambda x, b: (x * x, x + b.expand(8, 16)), (meta(8, 16), meta(16)))
    (mul,) = ops_named(t, "mul")
    assert work(mul).min_bytes == 2 * nbytes(128)  # x read once, y written
    (add,) = ops_named(t, "add")
    assert work(add).min_bytes == nbytes(128) + nbytes(16) + nbytes(128)


def test_inplace_ops_read_and_write_their_target_and_fill_only_writes():
    t = trace_fn(lambda x: (x.add_(1.0), x.zero_()), (meta(10, 10),))
    add = only(t, "add_")
    assert add.inplace and work(add).min_bytes == 2 * nbytes(100)
    assert work(only(t, "zero_")).min_bytes == nbytes(100)
