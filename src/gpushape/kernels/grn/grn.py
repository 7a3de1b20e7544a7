"""Global response normalization (GRN, ConvNeXt-V2), forward and backward in a few passes over
the tensor:

    g[n, c] = sqrt(sum over pixels of x[n, ..., c]^2)        (the L2 norm over H and W)
    y       = x + bias + weight * x * g / (mean over c of g[n, :] + eps)

as timm's `GlobalResponseNorm` and Hugging Face's `ConvNextV2GRN` compute it. Their eager form
runs some fifteen kernels a training step per GRN (norm, mean, add, divide, multiply, addcmul,
add, and the backward of each), each reading or writing a tensor as large as x: in
ConvNeXt-V2-Tiny's eager step on an H100 the GRNs took half the GPU time (20.6 of 40.6 ms). These
kernels read x twice and write y once in the forward, and read dy and x twice and write dx once
in the backward (`_launch.py`), the sums in float32 and deterministic.

Layouts, as timm's `channels_last` flag names them: True, an (N, H, W, C) tensor with the
channels last (ConvNeXt-V2's MLP, after its Linear layers); False, an (N, C, H, W) tensor, NCHW
or channels_last in memory. Other strides are copied into a dense layout first; y and dx keep
x's layout. Input float32 / float16 / bfloat16 (float64 too); weight and bias hold C values in
any shape (Hugging Face keeps them as (1, 1, 1, C)); their gradients take their shape and dtype.

Layers: Triton kernels (`_kernels.py`), launchers (`_launch.py`) with the plain-PyTorch
reference for CPU tensors (`_reference.py`); here the custom ops gpushape::global_response_norm
and gpushape::global_response_norm_backward (fake implementations, registered autograd:
torch.compile, CUDA graphs, meta tensors), the eager autograd.Function, the functional
`global_response_norm` and the module `GlobalResponseNorm`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .._dispatch import check_float, check_same_device, eager_path, functorch_active
from ._launch import empty_out, grn_backward, grn_forward
from ._reference import reference_forward

__all__ = ["GlobalResponseNorm", "global_response_norm"]
_OP = "global_response_norm"


# ---- custom ops: what torch.compile and meta tensors go through -----------------------------
@torch.library.custom_op("gpushape::global_response_norm", mutates_args=())
def grn_op(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, channels_last: bool
) -> tuple[Tensor, Tensor]:
    """(y, g): g (N, C) float32 (float64 for float64 x), the norms the backward reads."""
    return grn_forward(x, weight, bias, eps, channels_last)


def _norms_like(x: Tensor, channels_last: bool) -> Tensor:
    n, c = x.shape[0], x.shape[3 if channels_last else 1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty((n, c), dtype=acc)


@grn_op.register_fake
def _(x, weight, bias, eps, channels_last):
    return empty_out(x, channels_last), _norms_like(x, channels_last)


@torch.library.custom_op("gpushape::global_response_norm_backward", mutates_args=())
def grn_backward_op(
    dy: Tensor, x: Tensor, weight: Tensor, g: Tensor, eps: float, channels_last: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); the parameter gradients are (C,) in weight's dtype."""
    return grn_backward(dy, x, weight, g, eps, channels_last)


@grn_backward_op.register_fake
def _(dy, x, weight, g, eps, channels_last):
    return empty_out(x, channels_last), torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, _bias, eps, channels_last = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.eps, ctx.channels_last = eps, channels_last
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # g never gets a gradient: no zeros built


def _backward(ctx, dy, _dg):
    if dy is None:
        return None, None, None, None, None
    x, weight, g = ctx.saved_tensors
    dx, dw, db = grn_backward_op(dy, x, weight, g, ctx.eps, ctx.channels_last)
    return dx, dw, db, None, None


grn_op.register_autograd(_backward, setup_context=_setup_context)


# ---- eager path: one autograd.Function straight to the launchers ----------------------------
class _GRNFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float, cl: bool) -> Tensor:
        y, g = grn_forward(x, weight, bias, eps, cl)
        ctx.save_for_backward(x, weight, g)
        ctx.eps, ctx.channels_last = eps, cl
        return y

    @staticmethod
    @once_differentiable  # the backward kernels have no derivative of their own
    def backward(ctx, dy: Tensor):
        x, weight, g = ctx.saved_tensors
        dx, dw, db = grn_backward(dy, x, weight, g, ctx.eps, ctx.channels_last)
        return dx, dw, db, None, None


# ---- checks ---------------------------------------------------------------------------------
def _check(x: Tensor, weight: Tensor, bias: Tensor, eps: float, channels_last: bool) -> int:
    """The channel count, after one-line errors for what the kernels cannot take."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{_OP}: {name} must be a Tensor, got {type(t).__name__}")
    check_float(_OP, x=x, weight=weight, bias=bias)
    check_same_device(_OP, x=x, weight=weight, bias=bias)
    if x.dim() != 4:
        layout = "(N, H, W, C)" if channels_last else "(N, C, H, W)"
        raise ValueError(f"{_OP}: x must be 4-D {layout}, got shape {tuple(x.shape)}")
    c = x.shape[3 if channels_last else 1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t.numel() != c:
            raise ValueError(
                f"{_OP}: {name} must hold one value per channel ({c}), got shape {tuple(t.shape)}"
            )
    if not eps >= 0:  # NaN too
        raise ValueError(f"{_OP}: eps must be >= 0, got {eps}")
    return c


# ---- functional and module ------------------------------------------------------------------
def global_response_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-6, channels_last: bool = True
) -> Tensor:
    """x + bias + weight * x * g / (mean_c g + eps), g the L2 norm of each channel over the
    pixels (see the module docstring). channels_last: x is (N, H, W, C) (True, timm's default)
    or (N, C, H, W) (False)."""
    eps = float(eps)
    _check(x, weight, bias, eps, channels_last)
    w, b = weight.reshape(-1), bias.reshape(-1)
    if functorch_active():  # torch.func: the plain-PyTorch composition, which it understands
        return reference_forward(x, w, b, eps, channels_last)[0]
    w, b = w.contiguous(), b.contiguous()
    if eager_path(x):
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b.requires_grad):
            return _GRNFn.apply(x, w, b, eps, channels_last)
        return grn_forward(x, w, b, eps, channels_last)[0]
    return grn_op(x, w, b, eps, channels_last)[0]


class GlobalResponseNorm(nn.Module):
    """timm's `GlobalResponseNorm(dim, eps, channels_last)` on gpushape's kernels: the same
    parameters (weight and bias, zeros at construction) under the same names, so checkpoints
    load either way. `from_module` takes over a timm or Hugging Face GRN's own parameters."""

    def __init__(
        self, dim: int, eps: float = 1e-6, channels_last: bool = True, device=None, dtype=None
    ):
        super().__init__()
        if dim < 1:
            raise ValueError(f"GlobalResponseNorm: dim must be >= 1, got {dim}")
        self.eps = float(eps)
        self.channels_last = bool(channels_last)
        self.weight = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))

    @classmethod
    def from_module(cls, module: nn.Module) -> GlobalResponseNorm:
        """This module holding `module`'s very parameters (their shape kept: Hugging Face's
        (1, 1, 1, C)), for timm's GlobalResponseNorm (its eps and layout) and Hugging Face's
        ConvNextV2GRN (eps 1e-6, channels last). TypeError for other modules."""
        eps, cl = _grn_settings(module)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.eps, new.channels_last = eps, cl
        new.weight, new.bias = module.weight, module.bias
        return new

    def forward(self, x: Tensor) -> Tensor:
        return global_response_norm(x, self.weight, self.bias, self.eps, self.channels_last)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}, channels_last={self.channels_last}"


HF_EPS = 1e-6  # fixed in transformers' ConvNextV2GRN.forward


def _grn_settings(module: nn.Module) -> tuple[float, bool]:
    """(eps, channels_last) of a timm or Hugging Face GRN; TypeError for anything else."""
    kind = type(module).__name__
    if kind == "GlobalResponseNorm" and hasattr(module, "channel_dim"):  # timm
        spatial = tuple(d % 4 for d in module.spatial_dim)
        cl = module.channel_dim % 4 == 3 and spatial == (1, 2)
        if not cl and not (module.channel_dim % 4 == 1 and spatial == (2, 3)):
            raise TypeError(f"GlobalResponseNorm: unexpected dims of {module!r}")
        return float(module.eps), cl
    if kind == "ConvNextV2GRN":  # transformers: always (N, H, W, C)
        return HF_EPS, True
    raise TypeError(
        f"GlobalResponseNorm.from_module: expected timm's GlobalResponseNorm or transformers' "
        f"ConvNextV2GRN, got {kind}"
    )
