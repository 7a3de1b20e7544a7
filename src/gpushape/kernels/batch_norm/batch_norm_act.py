"""BatchNorm2d + residual add + activation as one fused op, forward and backward in Triton.

    y = act(batch_norm(x) * weight + bias + residual)
    act: "relu", "none", "silu", "gelu" (erf, nn.GELU's default), "gelu_tanh", "hardswish"

Training uses the batch statistics (fp32, fp64 for fp64 input) and blends the running stats as
torch does (unbiased variance, `momentum`); eval uses the running stats. Eager calls run one
torch.autograd.Function, torch.compile traces custom ops with fake implementations (`_ops.py`);
CUDA-graph capture works on either path. Neither backward reads y: ReLU's takes its mask from
1 bit an element saved in the forward; SiLU's, GELU's and Hardswish's recompute the
pre-activation from x, the statistics, weight, bias and the residual (kept by reference: no
extra tensor is written, and the backward reads the residual once more, `_act_bwd_kernels.py`).
CPU tensors take the plain-PyTorch reference (`_reference.py`), unless TRITON_INTERPRET=1 (then
the Triton kernels run in the interpreter). Traffic per pass: see `_launch.py`.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from .._dispatch import (
    FLOAT_DTYPES,
    check_float,
    check_same_device,
    eager_path,
    functorch_active,
)
from . import _launch as launch
from ._ops import (
    ACTIVATIONS,
    _BatchNormActFn,
    batch_norm_act_apply,
    batch_norm_act_backward,
    batch_norm_stats,
    hand_over,
    handover_anchor,
)
from ._reference import TORCH_ACTIVATIONS

__all__ = [
    "ACTIVATIONS",
    "BatchNormAct2d",
    "batch_norm_act",
    "batch_norm_act_apply",
    "batch_norm_act_backward",
    "batch_norm_stats",
    "hand_over",
]
_OP = "batch_norm_act"


# ---- functional and module ----


def _check(x, weight, bias, running_mean, running_var, residual, training, eps, activation):
    if not isinstance(x, Tensor) or x.dim() != 4:
        got = f"{x.dim()}-D of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x)
        raise ValueError(f"{_OP}: expected a 4-D (N, C, H, W) input, got {got}")
    given = dict(
        x=x,
        weight=weight,
        bias=bias,
        running_mean=running_mean,
        running_var=running_var,
        residual=residual,
    )
    device = x.device
    if not all(
        t is None or (t.dtype in FLOAT_DTYPES and t.device == device) for t in given.values()
    ):  # the checks below say what is wrong
        check_float(_OP, **given)
        check_same_device(_OP, **given)
    c = x.shape[1]
    if c == 0:
        raise ValueError(f"{_OP}: the input has 0 channels (shape {tuple(x.shape)})")
    for name in ("weight", "bias", "running_mean", "running_var"):
        t = given[name]
        if t is not None and tuple(t.shape) != (c,):
            raise ValueError(
                f"{_OP}: {name} must have shape ({c},) to match the input's "
                f"C = {c}, got {tuple(t.shape)}"
            )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"{_OP}: residual must match the input's shape and dtype "
            f"{tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{_OP}: give both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError(
            f"{_OP}: eval (training=False) normalises with running_mean and "
            "running_var; pass them, or training=True for batch statistics"
        )
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"{_OP}: eps must be a finite number >= 0, got {eps}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{_OP}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if training and x.shape[0] * x.shape[2] * x.shape[3] == 1:  # torch's error, word for word
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {x.size()}"
        )


def batch_norm_act(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    activation: str = "relu",
    residual: Tensor | None = None,
) -> Tensor:
    """act(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    + residual) for a 4-D NCHW or channels_last x, as one fused op (see the module docstring).
    """
    _check(x, weight, bias, running_mean, running_var, residual, training, eps, activation)
    eps, momentum = float(eps), float(momentum)
    if functorch_active():  # torch.func: PyTorch's own ops, which it differentiates
        y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
        y = y if residual is None else y + residual
        return TORCH_ACTIVATIONS[activation](y)
    if eager_path(x):
        return _BatchNormActFn.apply(
            x,
            weight,
            bias,
            running_mean,
            running_var,
            residual,
            training,
            momentum,
            eps,
            activation,
            handover_anchor(residual),
        )
    if training:
        mean, stat = batch_norm_stats(x.detach(), running_mean, running_var, momentum, eps)
    else:
        mean, stat = running_mean.to(launch.stat_dtype(x)), running_var
    return batch_norm_act_apply(x, mean, stat, weight, bias, residual, eps, training, activation)[0]


class BatchNormAct2d(nn.BatchNorm2d):
    """nn.BatchNorm2d followed by `+ residual` and an activation, fused.

    Same parameters, buffers and state_dict as nn.BatchNorm2d (a torchvision checkpoint loads
    with strict=True), same running-stat and num_batches_tracked behaviour (momentum=None:
    cumulative average). forward(x, residual=None).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        activation: str = "relu",
        device=None,
        dtype=None,
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"BatchNormAct2d: activation must be one of {ACTIVATIONS}, got {activation!r}"
            )
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype
        )
        self.activation = activation

    @classmethod
    def from_batchnorm(cls, bn: nn.BatchNorm2d, activation: str = "relu") -> BatchNormAct2d:
        """A BatchNormAct2d that shares bn's parameters and buffers (not copies: optimizer state
        and checkpoints that hold bn's tensors keep pointing at the live ones)."""
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"from_batchnorm: expected nn.BatchNorm2d, got {type(bn).__name__}")
        new = cls(
            bn.num_features,
            bn.eps,
            bn.momentum,
            bn.affine,
            bn.track_running_stats,
            activation,
            device="meta",
        )
        for name in ("weight", "bias"):
            setattr(new, name, getattr(bn, name))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            setattr(new, name, getattr(bn, name))
        return new.train(bn.training)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as nn.BatchNorm2d
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return batch_norm_act(
            x,
            self.weight,
            self.bias,
            self.running_mean if track else None,
            self.running_var if track else None,
            batch_stats,
            factor,
            self.eps,
            self.activation,
            residual,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"
