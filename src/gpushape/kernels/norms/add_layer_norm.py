"""Residual add fused into LayerNorm (pre-norm transformer block): s = x + residual;
y = LayerNorm(s) * weight + bias. Returns (y, s): s is the residual stream for the next block.

Minimum bytes (S = x's size in bytes): forward reads x and residual, writes y and s (4 S);
backward reads s, dy and ds (the gradient reaching s from the residual stream) and writes one
dx, which is the gradient of both x and residual (4 S). Eager PyTorch writes s, reads it back
for the norm, and reads s and dy twice in the backward.

Layers: kernels (shared, `_kernels.py`), launchers (`add_layer_norm_forward` /
`add_layer_norm_backward`), the custom op with fake and autograd, the functional
`add_layer_norm` and the module `AddLayerNorm`.
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
from ._reference import ACT_NONE


# ---- launchers ------------------------------------------------------------------------------
def add_layer_norm_forward(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, s, mean, rstd); s = x + residual in x's dtype; mean, rstd: x.shape[:-1], float32."""
    out = norm_forward(x, residual, weight, bias, eps, act=ACT_NONE, rms=False)
    return out.y, out.s, out.mean, out.rstd


def add_layer_norm_backward(
    dy: Tensor,
    ds: Tensor | None,
    s: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(d_sum, dweight, dbias): d_sum is the gradient of x and of residual alike."""
    return tuple(norm_backward(dy, ds, s, weight, bias, mean, rstd, act=ACT_NONE, rms=False))


# ---- custom op: fake and autograd -----------------------------------------------------------
@torch.library.custom_op("gpushape::add_layer_norm", mutates_args=())
def _add_layer_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return add_layer_norm_forward(x, residual, weight, bias, eps)


@_add_layer_norm_op.register_fake
def _(x, residual, weight, bias, eps):
    return fake_forward(x, outputs=2, stats=2)


@torch.library.custom_op("gpushape::add_layer_norm_backward", mutates_args=())
def _add_layer_norm_backward_op(
    dy: Tensor,
    ds: Tensor | None,
    s: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    dsum, dw, db = add_layer_norm_backward(dy, ds, s, weight, bias, mean, rstd)
    return op_grads(dsum, s, dw, db)


@_add_layer_norm_backward_op.register_fake
def _(dy, ds, s, weight, bias, mean, rstd):
    return fake_grads(s, weight, bias)


def _setup_context(ctx, inputs, output):
    _x, _residual, weight, bias, _eps = inputs
    _, s, mean, rstd = output
    ctx.save_for_backward(s, weight, bias, mean, rstd)
    ctx.set_materialize_grads(False)  # an unused s gets no zeros tensor to read back


def _backward(ctx, dy, ds, _dmean, _drstd):
    s, weight, bias, mean, rstd = ctx.saved_tensors
    if dy is None:  # only the sum was used downstream: d(x + residual) = ds
        return ds, ds, None, None, None
    dsum, dw, db = _add_layer_norm_backward_op(dy, ds, s, weight, bias, mean, rstd)
    # One tensor serves both inputs, as for any add; autograd never writes into it.
    return dsum, dsum, None if weight is None else dw, None if bias is None else db, None


_add_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)


# ---- functional and module ------------------------------------------------------------------
def add_layer_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[Tensor, Tensor]:
    """(layer_norm(x + residual, (N,), weight, bias, eps), x + residual).

    x, residual: (..., N), same shape and float dtype; weight, bias: (N,) or None; statistics in
    float32. Both outputs have x's shape and dtype.
    """
    check_norm_inputs("add_layer_norm", x, weight, bias, eps, residual=residual)
    if eager_path(x):
        return run_eager(x, residual, weight, bias, float(eps), act=ACT_NONE, rms=False)
    y, s, _, _ = _add_layer_norm_op(
        x.contiguous(),
        residual.contiguous(),
        contiguous_or_none(weight),
        contiguous_or_none(bias),
        float(eps),
    )
    return y, s


class AddLayerNorm(AffineNorm):
    """`s = x + residual; y = nn.LayerNorm(normalized_shape)(s)`, fused; forward returns (y, s).

    Parameters are named as in nn.LayerNorm: a LayerNorm's state_dict loads unchanged.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(
            normalized_shape,
            eps,
            elementwise_affine=elementwise_affine,
            bias=bias,
            device=device,
            dtype=dtype,
        )

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        return add_layer_norm(x, residual, self.weight, self.bias, self.eps)
