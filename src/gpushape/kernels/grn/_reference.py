"""Plain-PyTorch global response normalization: what CPU tensors run (unless
TRITON_INTERPRET=1) and what the Triton kernels are tested against.

Forward and backward in float32 (float64 for float64 input), rounded once to the input's dtype,
as the kernels do. The backward is written out (autograd is off inside a custom op); the tests
check it, and the kernels, against autograd on timm's composition.
"""

from __future__ import annotations

import torch


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _spatial(channels_last: bool) -> tuple[tuple[int, int], int]:
    """(the pixel dims, the channel dim) of a 4-D input."""
    return ((1, 2), 3) if channels_last else ((2, 3), 1)


def _view(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A (C,) or (N, C) tensor shaped to broadcast over the input."""
    if channels_last:
        return t.view(*t.shape[:-1], 1, 1, t.shape[-1]) if t.dim() == 2 else t.view(1, 1, 1, -1)
    return t.view(*t.shape, 1, 1) if t.dim() == 2 else t.view(1, -1, 1, 1)


def norms(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """g (N, C): each channel's L2 norm over the pixels, in float32 (float64)."""
    dims, _ = _spatial(channels_last)
    return torch.linalg.vector_norm(x.to(_acc(x)), 2, dims)


def _compose(x, g, weight, bias, eps, channels_last):
    ratio = g / (g.mean(dim=1, keepdim=True) + eps)
    scale = 1 + weight.to(g.dtype) * ratio
    return x * _view(scale, channels_last) + _view(bias.to(g.dtype), channels_last)


def reference_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, channels_last: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y in x's dtype and layout, g (N, C))."""
    g = norms(x, channels_last)
    y = _compose(x.to(g.dtype), g, weight, bias, eps, channels_last)
    return y.to(x.dtype), g


def reference_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    channels_last: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias): the gradients of reference_forward, in the dtypes of x and weight,
    written out (autograd is off inside a custom op, where torch.compile and meta tensors run
    this). With d = mean_c g + eps and s_c = sum over pixels of dy * x:
        dweight_c = s_c g_c / d,  dbias_c = sum dy,
        dx = dy (1 + w g / d) + x dg / g,  dg_c = w_c s_c / d - sum_c' w_c' s_c' g_c' / (C d^2)
    (dg / g taken as 0 where g = 0, as vector_norm's gradient is; tests compare both with
    autograd on timm's composition)."""
    acc = _acc(x)
    dims, _ = _spatial(channels_last)
    xs, dys = x.to(acc), dy.to(acc)
    w = weight.to(acc)
    g = norms(xs, channels_last)  # (N, C)
    d = g.mean(dim=1, keepdim=True) + eps
    s = (dys * xs).sum(dim=dims)  # (N, C)
    dg = w * s / d - (w * s * g).sum(dim=1, keepdim=True) / (g.shape[1] * d * d)
    coef = torch.where(g > 0, dg / torch.where(g > 0, g, 1.0), 0.0)
    dx = dys * _view(1 + w * g / d, channels_last) + xs * _view(coef, channels_last)
    dw = (s * g / d).sum(dim=0)
    db = dys.sum(dim=(0, *dims))
    return dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype)
