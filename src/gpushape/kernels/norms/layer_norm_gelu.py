"""LayerNorm followed by GELU in one pass: y = gelu(LayerNorm(x) * weight + bias).

Minimum bytes (S = x's size in bytes): forward reads x, writes y (2 S); backward reads x and dy,
writes dx (3 S). The forward saves only the per-row mean and rstd (M floats each); the backward
recomputes the normalised x and the GELU input from them. Eager PyTorch writes and re-reads the
LayerNorm output, and its backward reads x and dy twice (once for dx, once for dweight/dbias).

Layers: kernels (shared with the other norms, in `_kernels.py`), launchers
(`layer_norm_gelu_forward` / `layer_norm_gelu_backward`), the custom op with its fake and
autograd, then the functional `layer_norm_gelu` and the module `LayerNormGELU`.
"""

import torch
from torch import Tensor

from ._common import (
    AffineNorm,
    check_norm_inputs,
    contiguous_or_none,
    eager_path,
    fake_forward,
    fake_grads,
    norm_backward,
    norm_forward,
    op_grads,
    run_eager,
)
from ._reference import GELU_ERF, GELU_TANH

_ACT = {"none": GELU_ERF, "tanh": GELU_TANH}


# ---- launchers ------------------------------------------------------------------------------
def layer_norm_gelu_forward(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, approximate: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, rstd); mean and rstd have shape x.shape[:-1] (float32, float64 for float64)."""
    out = norm_forward(x, None, weight, bias, eps, act=_ACT[approximate], rms=False)
    return out.y, out.mean, out.rstd


def layer_norm_gelu_backward(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    approximate: str,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias); dweight / dbias are None where weight / bias are."""
    return tuple(
        norm_backward(dy, None, x, weight, bias, mean, rstd, act=_ACT[approximate], rms=False)
    )


# ---- custom op: fake and autograd -----------------------------------------------------------
@torch.library.custom_op("gpushape::layer_norm_gelu", mutates_args=())
def _layer_norm_gelu_op(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, approximate: str
) -> tuple[Tensor, Tensor, Tensor]:
    return layer_norm_gelu_forward(x, weight, bias, eps, approximate)


@_layer_norm_gelu_op.register_fake
def _(x, weight, bias, eps, approximate):
    return fake_forward(x, outputs=1, stats=2)


@torch.library.custom_op("gpushape::layer_norm_gelu_backward", mutates_args=())
def _layer_norm_gelu_backward_op(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    approximate: str,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = layer_norm_gelu_backward(dy, x, weight, bias, mean, rstd, approximate)
    return op_grads(dx, x, dw, db)


@_layer_norm_gelu_backward_op.register_fake
def _(dy, x, weight, bias, mean, rstd, approximate):
    return fake_grads(x, weight, bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, _eps, approximate = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.approximate = approximate
    ctx.set_materialize_grads(False)  # mean / rstd never get a gradient: don't build zeros


def _backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    if dy is None:
        return None, None, None, None, None
    dx, dw, db = _layer_norm_gelu_backward_op(dy, x, weight, bias, mean, rstd, ctx.approximate)
    return (dx, None if weight is None else dw, None if bias is None else db, None, None)


_layer_norm_gelu_op.register_autograd(_backward, setup_context=_setup_context)


# ---- functional and module ------------------------------------------------------------------
def layer_norm_gelu(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    approximate: str = "none",
) -> Tensor:
    """gelu(layer_norm(x, (N,), weight, bias, eps), approximate) over the last dimension N.

    x: (..., N) float32 / float16 / bfloat16 (float64 too); weight, bias: (N,) or None, any float
    dtype; statistics in float32. Returns x's shape and dtype.
    """
    check_norm_inputs("layer_norm_gelu", x, weight, bias, eps)
    act = _ACT.get(approximate)
    if act is None:
        raise ValueError(
            f"layer_norm_gelu: approximate must be 'none' or 'tanh', got {approximate!r}"
        )
    if eager_path(x):
        return run_eager(x, None, weight, bias, float(eps), act=act, rms=False)
    y, _, _ = _layer_norm_gelu_op(
        x.contiguous(),
        contiguous_or_none(weight),
        contiguous_or_none(bias),
        float(eps),
        approximate,
    )
    return y


class LayerNormGELU(AffineNorm):
    """nn.LayerNorm(normalized_shape) then nn.GELU(approximate), fused into one kernel each way.

    Parameters are named as in nn.LayerNorm: a LayerNorm's state_dict loads unchanged.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        approximate: str = "none",
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        if approximate not in _ACT:
            raise ValueError(
                f"LayerNormGELU: approximate must be 'none' or 'tanh', got {approximate!r}"
            )
        super().__init__(
            normalized_shape,
            eps,
            elementwise_affine=elementwise_affine,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_gelu(x, self.weight, self.bias, self.eps, self.approximate)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, approximate={self.approximate!r}"
