"""Launchers for the batch_norm_act Triton kernels: layout, plans, grids, buffers.

Traffic per call, in passes over one (N, C, H, W) tensor (ReLU mask bits cost 1/16 of a pass):
  training forward:  read x (stats); read x, residual; write y, bits   = 4 + 1/16
  training backward: read dy, x, bits (sums); read dy, x, bits; write dx, d_residual = 6 + 1/8
    with the gradient in two parts (dy + dy2): read dy, dy2, x, bits; write dz (= d_residual);
    read dz, x; write dx = 7 + 1/16, where adding them first costs 3 more passes (`_ops.py`)
  eval forward: 3 (+1/16), eval backward: 4 (+1/16) — with residual and ReLU.
SiLU, GELU and Hardswish write no bits (forward 4 with a residual, 3 without) and recompute the
pre-activation in the backward: 7 passes with a residual, 5 without (`_act_bwd_kernels.py`).

Host cost matters: at ResNet-50's later stages a training step's share of this op is 0.1-0.3 ms
of GPU time, less than the Python of a naive launch path. So everything that follows from
shapes, strides, dtypes and the tuning (view, tiles, grids, constexprs, the reductions' P, the
compiled kernels) is worked out once per signature and kept in a plan (`forward_plan`,
`backward_plan`); a call then allocates its outputs and launches two kernels a direction (the
partial sums are added by the reduction's last program: `_kernels.py`). After a
kernel's first launch through Triton's JIT, `Launch` (`_runtime.py`) calls the
compiled kernel's launcher directly (the JIT re-derives the specialisation on every call).
Launch configurations come from `_tuning.py` (a per-shape table: data).
"""

from __future__ import annotations

import torch

from .._plan_cache import PlanCache
from . import _tuning as tuning_table
from ._bwd_plans import ActBackwardPlan, BackwardPlan
from ._plans import ForwardPlan, View, in_layout, stat_dtype

__all__ = [
    "ActBackwardPlan",
    "BackwardPlan",
    "ForwardPlan",
    "backward_plan",
    "forward_plan",
    "in_layout",
    "stat_dtype",
]


# ---- plans, cached per signature ----

_MAX_PLANS = 4096  # signatures; a model has tens
_PLANS: PlanCache[ForwardPlan | BackwardPlan | ActBackwardPlan] = PlanCache(_MAX_PLANS)


def _dtype(t: torch.Tensor | None):
    return None if t is None else t.dtype


def forward_plan(
    x, weight, bias, running_mean, running_var, residual, training: bool, relu: bool, act: int = 0
) -> ForwardPlan:
    """The cached plan of a forward with these inputs' shapes, strides and dtypes; `act`: a
    smooth activation's code (`_act_math.ACT_CODES`), 0 for ReLU (`relu`) or none."""
    key = (
        "fwd",
        x.shape,
        x.stride(),
        x.dtype,
        x.get_device(),
        _dtype(weight),
        _dtype(bias),
        _dtype(running_mean),
        _dtype(running_var),
        residual is not None,
        training,
        relu,
        act,
        tuning_table.generation,
    )

    def build():
        view = View.of(x)
        tuning = tuning_table.tuning_for(view.C, view.M, view.channels_last)
        return ForwardPlan(
            x, view, tuning, weight, bias, running_mean, running_var, residual, training, relu, act
        )

    return _PLANS.get(key, build)


def backward_plan(
    x, weight, stat, training: bool, relu: bool, res_grad: bool, fold: bool = False
) -> BackwardPlan:
    """`fold`: the output gradient comes in two parts (dy, dy2), added inside the kernels."""
    key = (
        "bwd",
        x.shape,
        x.stride(),
        x.dtype,
        x.get_device(),
        _dtype(weight),
        stat.dtype,
        training,
        relu,
        res_grad,
        fold,
        tuning_table.generation,
    )

    def build():
        view = View.of(x)
        tuning = tuning_table.tuning_for(view.C, view.M, view.channels_last)
        return BackwardPlan(x, view, tuning, weight, stat, training, relu, res_grad, fold)

    return _PLANS.get(key, build)


# ---- the custom ops' implementations (each call looks its plan up) ----


def batch_stats(x, running_mean, running_var, momentum: float, eps: float):
    """Batch mean and 1/sqrt(var + eps) over N*H*W (fp32); blends the running stats in place."""
    plan = forward_plan(x, None, None, running_mean, running_var, None, True, False)
    return plan.stats(x, running_mean, running_var, momentum, eps)


def apply(
    x, mean, stat, weight, bias, residual, eps: float, stat_is_var: bool, relu: bool, act: int = 0
):
    """y = act((x - mean) * rstd * weight + bias + residual), and the ReLU mask bits."""
    plan = forward_plan(
        x, weight, bias, None, stat if stat_is_var else None, residual, not stat_is_var, relu, act
    )
    return plan.apply(x, mean, stat, weight, bias, residual, eps)


def backward(
    dy,
    x,
    weight,
    mean,
    stat,
    bits,
    eps: float,
    training: bool,
    relu: bool,
    res_grad: bool,
    dy2=None,
):
    """(dx, dweight, dbias, d_residual); dweight/dbias in the statistics dtype. `dy2`: a
    second part of the output gradient (the gradient is dy + dy2), read by the kernels."""
    plan = backward_plan(x, weight, stat, training, relu, res_grad, dy2 is not None)
    return plan.run(dy, x, weight, mean, stat, bits, eps, dy2)


def act_backward_plan(
    x, weight, bias, stat, training: bool, act: int, has_res: bool
) -> ActBackwardPlan:
    key = (
        "act_bwd",
        x.shape,
        x.stride(),
        x.dtype,
        x.get_device(),
        _dtype(weight),
        _dtype(bias),
        stat.dtype,
        training,
        act,
        has_res,
        tuning_table.generation,
    )

    def build():
        view = View.of(x)
        tuning = tuning_table.tuning_for(view.C, view.M, view.channels_last)
        return ActBackwardPlan(x, view, tuning, weight, bias, stat, training, act, has_res)

    return _PLANS.get(key, build)


def act_backward(dy, x, weight, bias, residual, mean, stat, eps: float, training: bool, act: int):
    """(dx, dweight, dbias, d_residual) of a smooth activation (`act`: its code), the
    pre-activation recomputed from x, the statistics, weight, bias and the residual."""
    plan = act_backward_plan(x, weight, bias, stat, training, act, residual is not None)
    return plan.run(dy, x, weight, bias, residual, mean, stat, eps)
