"""What the GRN tests share (CPU and GPU lanes): PyTorch's own GRN (timm's composition, run at
the input's dtype), inputs in each layout, and the numeric gate over y and every gradient."""

from __future__ import annotations

import torch

from gpushape.kernels import global_response_norm

from ._numeric import gate_forward_backward

# (channels_last flag, memory format of the 4-D input): the three layouts the kernels take
LAYOUTS = {
    "nhwc": (True, torch.contiguous_format),
    "nchw": (False, torch.contiguous_format),
    "nchw-cl": (False, torch.channels_last),
}


def torch_grn(x, weight, bias, eps=1e-6, channels_last=True):
    """timm's GlobalResponseNorm.forward, word for word, on plain tensors."""
    dims, cdim, shape = ((1, 2), -1, (1, 1, 1, -1)) if channels_last else ((2, 3), 1, (1, -1, 1, 1))
    x_g = x.norm(p=2, dim=dims, keepdim=True)
    x_n = x_g / (x_g.mean(dim=cdim, keepdim=True) + eps)
    return x + torch.addcmul(bias.view(shape), weight.view(shape), x * x_n)


def make_case(n, h, w, c, dtype, layout, device="cpu"):
    """(x, weight, bias) requiring grad: x's mean away from zero, weight and bias random (a
    trained GRN's are; timm's zeros would make y = x)."""
    channels_last, fmt = LAYOUTS[layout]
    shape = (n, h, w, c) if channels_last else (n, c, h, w)
    x = (0.7 * torch.randn(shape, device=device) - 0.3).to(dtype)
    if not channels_last:
        x = x.contiguous(memory_format=fmt)
    weight = torch.randn(c, device=device).to(dtype)
    bias = torch.randn(c, device=device).to(dtype)
    return [t.requires_grad_() for t in (x, weight, bias)]


def gate(x, weight, bias, channels_last, eps=1e-6, **kw):
    """The numeric gate on y and the gradients of x, weight and bias."""

    def ours(x, w, b):
        return global_response_norm(x, w, b, eps, channels_last)

    def theirs(x, w, b):
        return torch_grn(x, w, b, eps, channels_last)

    return gate_forward_backward(ours, theirs, (x, weight, bias), names=("x", "w", "b"), **kw)
