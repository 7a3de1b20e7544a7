"""torch.func transforms over gpushape's ops: grad (and vmap of grad) run, and agree with
ordinary autograd on the same op. gpushape's eager autograd.Functions and custom ops do not
support functorch, so under a transform the ops take their plain-PyTorch reference."""

import pytest
import torch

from gpushape.kernels import (
    BatchNormAct2d,
    add_layer_norm,
    layer_norm_gelu,
    rms_norm,
    softmax_dropout,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _check(fn, *inputs):
    """torch.func.grad of fn against torch.autograd.grad, w.r.t. every input."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    want = torch.autograd.grad(fn(*leaves), leaves, allow_unused=True, materialize_grads=True)
    got = torch.func.grad(fn, argnums=tuple(range(len(inputs))))(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm_gelu", "add_layer_norm"])
def test_row_norms_under_torch_func_grad(op):
    torch.manual_seed(0)
    x, r = torch.randn(2, 3, 32, device=DEV), torch.randn(2, 3, 32, device=DEV)
    w, b = torch.randn(32, device=DEV), torch.randn(32, device=DEV)
    fns = {
        "rms_norm": lambda x, r, w, b: (rms_norm(x, w) * r).sum(),
        "layer_norm_gelu": lambda x, r, w, b: (layer_norm_gelu(x, w, b) * r).sum(),
        "add_layer_norm": lambda x, r, w, b: sum((t * t).sum() for t in add_layer_norm(x, r, w, b)),
    }
    _check(fns[op], x, r, w, b)


def test_batch_norm_act_under_torch_func_grad_and_vmap():
    torch.manual_seed(0)
    bn = BatchNormAct2d(8).to(DEV).eval()  # eval: no running-stat update inside vmap
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x, r = torch.randn(4, 8, 5, 5, device=DEV), torch.randn(4, 8, 5, 5, device=DEV)
    _check(lambda x, r: (bn(x, r) ** 2).sum(), x, r)
    per_sample = torch.func.vmap(
        torch.func.grad(lambda xi, ri: (bn(xi[None], ri[None]) ** 2).sum())
    )(x, r)
    leaves = x.clone().requires_grad_()
    (full,) = torch.autograd.grad((bn(leaves, r) ** 2).sum(), leaves)
    torch.testing.assert_close(per_sample, full, rtol=1e-4, atol=1e-5)


def test_softmax_dropout_under_torch_func_grad():
    """With dropout, the same seed (the same RNG state) drops the same elements either way."""
    x = torch.randn(2, 4, 16, 16, device=DEV)
    w = torch.randn_like(x)

    def loss(x):
        torch.manual_seed(1)
        return (softmax_dropout(x, 0.2, training=True, scale=0.5, is_causal=True) * w).sum()

    _check(loss, x)
