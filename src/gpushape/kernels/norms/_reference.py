"""The plain-PyTorch reference of the row-normalisation ops, and the shape of their results.

CPU tensors run it when TRITON_INTERPRET is not set. It follows the kernels' contract: the sum
x + residual is rounded to x's dtype before it is normalised; statistics, the affine step and the
activation are computed in float32 (float64 for float64 inputs) and rounded once at the end; the
backward recomputes x_hat from the saved (M,) mean and rstd.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

ACT_NONE, GELU_ERF, GELU_TANH = 0, 1, 2  # the activation after the norm


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics and accumulators: float32, or float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class NormForward(NamedTuple):
    y: torch.Tensor  # x's shape and dtype
    s: torch.Tensor | None  # x + residual, when a residual was given
    mean: torch.Tensor | None  # x.shape[:-1], stat_dtype; None for RMSNorm
    rstd: torch.Tensor  # x.shape[:-1], stat_dtype


class NormBackward(NamedTuple):
    dx: torch.Tensor
    dweight: torch.Tensor | None
    dbias: torch.Tensor | None


def _act_fn(h: torch.Tensor, act: int) -> torch.Tensor:
    if act == ACT_NONE:
        return h
    return F.gelu(h, approximate="tanh" if act == GELU_TANH else "none")


def _act_grad(h: torch.Tensor, act: int) -> torch.Tensor:
    if act == GELU_ERF:
        cdf = 0.5 * (1.0 + torch.erf(h * math.sqrt(0.5)))
        return cdf + h * torch.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)
    k0, k1 = math.sqrt(2.0 / math.pi), 0.044715
    th = torch.tanh(k0 * (h + k1 * h**3))
    return 0.5 * (1.0 + th) + 0.5 * h * (1.0 - th * th) * k0 * (1.0 + 3.0 * k1 * h * h)


def _xhat(xf: torch.Tensor, mean: torch.Tensor | None, rstd: torch.Tensor) -> torch.Tensor:
    centred = xf if mean is None else xf - mean.unsqueeze(-1)
    return centred * rstd.unsqueeze(-1)


def _affine(xhat, weight, bias, acc):
    h = xhat if weight is None else xhat * weight.to(acc)
    return h if bias is None else h + bias.to(acc)


def reference_forward(x, residual, weight, bias, eps, *, act, rms) -> NormForward:
    acc = stat_dtype(x.dtype)
    s = None if residual is None else x + residual  # rounded to x's dtype, as the kernel does
    xf = (x if s is None else s).to(acc)
    mean = None if rms else xf.mean(-1)
    centred = xf if mean is None else xf - mean.unsqueeze(-1)
    rstd = torch.rsqrt(centred.square().mean(-1) + eps)
    y = _act_fn(_affine(_xhat(xf, mean, rstd), weight, bias, acc), act)
    return NormForward(y.to(x.dtype), s, mean, rstd)


def reference_backward(dy, ds, xs, weight, bias, mean, rstd, *, act, rms) -> NormBackward:
    acc = stat_dtype(xs.dtype)
    n = xs.shape[-1]
    xhat = _xhat(xs.to(acc), mean, rstd)
    dh = dy.to(acc)
    if act != ACT_NONE:
        dh = dh * _act_grad(_affine(xhat, weight, bias, acc), act)
    g = dh if weight is None else dh * weight.to(acc)
    dx = g - xhat * (g * xhat).mean(-1, keepdim=True)
    if not rms:
        dx = dx - g.mean(-1, keepdim=True)
    dx = dx * rstd.unsqueeze(-1)
    if ds is not None:
        dx = dx + ds.to(acc)
    dw = None if weight is None else (dh * xhat).reshape(-1, n).sum(0).to(weight.dtype)
    db = None if bias is None else dh.reshape(-1, n).sum(0).to(bias.dtype)
    return NormBackward(dx.to(xs.dtype), dw, db)
