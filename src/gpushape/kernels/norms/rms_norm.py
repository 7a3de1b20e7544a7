"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension.

Minimum bytes (S = x's size in bytes): forward reads x, writes y (2 S); backward reads x and dy,
writes dx (3 S). The forward saves only the per-row rstd; the backward recomputes x * rstd.

Layers: kernels (shared, `_kernels.py`), launchers (`rms_norm_forward` /
`rms_norm_backward`), the custom op with fake and autograd, the functional `rms_norm` and the
module `RMSNorm`.
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
def rms_norm_forward(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """(y, rstd); rstd has shape x.shape[:-1], float32 (float64 for float64 x)."""
    out = norm_forward(x, None, weight, None, eps, act=ACT_NONE, rms=True)
    return out.y, out.rstd


def rms_norm_backward(
    dy: Tensor, x: Tensor, weight: Tensor | None, rstd: Tensor
) -> tuple[Tensor, Tensor | None]:
    """(dx, dweight); dweight is None where weight is."""
    dx, dw, _ = norm_backward(dy, None, x, weight, None, None, rstd, act=ACT_NONE, rms=True)
    return dx, dw


# ---- custom op: fake and autograd -----------------------------------------------------------
@torch.library.custom_op("gpushape::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    return rms_norm_forward(x, weight, eps)


@_rms_norm_op.register_fake
def _(x, weight, eps):
    return fake_forward(x, outputs=1, stats=1)


@torch.library.custom_op("gpushape::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(
    dy: Tensor, x: Tensor, weight: Tensor | None, rstd: Tensor
) -> tuple[Tensor, Tensor]:
    dx, dw = rms_norm_backward(dy, x, weight, rstd)
    return op_grads(dx, x, dw)


@_rms_norm_backward_op.register_fake
def _(dy, x, weight, rstd):
    return fake_grads(x, weight)


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.set_materialize_grads(False)  # rstd never gets a gradient: don't build zeros


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    if dy is None:
        return None, None, None
    dx, dw = _rms_norm_backward_op(dy, x, weight, rstd)
    return dx, None if weight is None else dw, None


_rms_norm_op.register_autograd(_backward, setup_context=_setup_context)


# ---- functional and module ------------------------------------------------------------------
def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """torch.nn.functional.rms_norm(x, (N,), weight, eps) over the last dimension N.

    x: (..., N) float32 / float16 / bfloat16 (float64 too); weight: (N,) or None; the sum of
    squares, rstd and the product with weight are computed in float32, then rounded once.
    """
    check_norm_inputs("rms_norm", x, weight, None, eps)
    if eager_path(x):
        return run_eager(x, None, weight, None, float(eps), act=ACT_NONE, rms=True)
    y, _ = _rms_norm_op(x.contiguous(), contiguous_or_none(weight), float(eps))
    return y


class RMSNorm(AffineNorm):
    """nn.RMSNorm(normalized_shape, eps) over the last dimension, as one kernel each way.

    The parameter is named `weight` as in nn.RMSNorm: its state_dict loads unchanged.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(
            normalized_shape,
            eps,
            elementwise_affine=elementwise_affine,
            bias=False,
            device=device,
            dtype=dtype,
        )

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)
