"""Plain-PyTorch global response normalization: what CPU tensors run (unless
TRITON_INTERPRET=1) and what the Triton kernels are tested against.

Forward and backward in float32 (float64 for float64 input), rounded once to the input's dtype,
as the kernels do. The backward differentiates the same composition with autograd, so the
formula the kernels hand-write is checked against PyTorch's own derivatives.
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
    """(dx, dweight, dbias): the gradients of reference_forward, in the dtypes of x and weight."""
    acc = _acc(x)
    with torch.enable_grad():
        xs = x.detach().to(acc).requires_grad_(True)
        ws = weight.detach().to(acc).requires_grad_(True)
        bs = torch.zeros_like(ws, requires_grad=True)
        # vector_norm's gradient is x / g, and 0 where g = 0: the rule the kernels follow
        y = _compose(xs, norms(xs, channels_last), ws, bs, eps, channels_last)
        dx, dw, db = torch.autograd.grad(y, (xs, ws, bs), dy.to(acc))
    return dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype)
