"""batch_norm_act's implementations and their two front ends (the op itself: `batch_norm_act.py`).

Eager calls run the implementations through one torch.autograd.Function (`_BatchNormActFn`:
statistics and the fused pass, one cached launch plan); under torch.compile these custom ops
carry them, each with a fake (meta) implementation:
  gpushape::batch_norm_stats       mean, rstd of x; updates running stats in place (no autograd:
                                   called on x.detach())
  gpushape::batch_norm_act_apply   y and the ReLU mask bits, with a registered autograd whose
                                   backward (gpushape::batch_norm_act_backward) differentiates
                                   through the batch statistics when `training` is set
What the backward keeps: x, weight, the statistics and, for ReLU, the mask bits (1 bit an
element); for SiLU, GELU and Hardswish, bias and the residual instead (references, no copies:
the pre-activation is recomputed from them, `_act_bwd_kernels.py`).
CPU tensors take the plain-PyTorch reference (`_reference.py`), unless TRITON_INTERPRET=1 (then
the Triton kernels run in the interpreter).

Residual gradients handed over (eager path only). In a ResNet the output of one block's fused
norm feeds the next block twice: its first convolution and its residual add. Autograd's engine
adds the two gradients (one elementwise kernel reading two tensors, writing a third) before the
first norm's backward reads the sum twice. When the residual of a `_BatchNormActFn` call is the
direct output of another `_BatchNormActFn` call, the consumer's backward instead appends the
residual's gradient to its producer's node and returns None for it; the producer's backward
then reads both parts in its kernels (`_bwd_kernels.py`, 7 passes where 9 were). The engine
runs a node only after every node that feeds it, so the handed-over part is always there in time.
Only a backward of the whole graph (`.backward()` without `inputs`) hands over, as a scalar
leaf passed to the consumer tells (`handover_anchor`): autograd.grad and `inputs=` may capture
the producer's output's gradient, which must be whole. Nor does a residual tensor with hooks or
a retained grad (they would see part of the gradient), or one no longer alive to check.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from .._dispatch import use_triton
from . import _launch as launch
from ._act_math import ACT_CODES
from ._reference import act_backward_ref as _act_backward_ref
from ._reference import apply_ref as _apply_ref
from ._reference import backward_ref as _backward_ref
from ._reference import stats_ref as _stats_ref

ACTIVATIONS = ("relu", "none", "silu", "gelu", "gelu_tanh", "hardswish")


# ---- implementations (Triton or reference), registered as custom ops below ----


def _stats(
    x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, momentum: float, eps: float
) -> tuple[Tensor, Tensor]:
    """Batch mean and 1/sqrt(var + eps) per channel; blends running stats in place if given."""
    if x.numel() == 0:  # as torch: nothing to normalise, running stats untouched
        zeros = x.new_zeros(x.shape[1], dtype=launch.stat_dtype(x))
        return zeros, zeros.clone()
    if use_triton(x):
        return launch.batch_stats(x, running_mean, running_var, momentum, eps)
    return _stats_ref(x, running_mean, running_var, momentum, eps)


def _apply(
    x: Tensor,
    mean: Tensor,
    stat: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    residual: Tensor | None,
    eps: float,
    training: bool,
    activation: str,
) -> tuple[Tensor, Tensor]:
    """(y, ReLU mask bits). `stat` is the batch rstd when training, else the running var.
    With training set the backward treats mean/stat as x's batch statistics."""
    if use_triton(x):
        act = ACT_CODES.get(activation, 0)
        relu = activation == "relu"
        return launch.apply(x, mean, stat, weight, bias, residual, eps, not training, relu, act)
    return _apply_ref(x, mean, stat, weight, bias, residual, eps, not training, activation)


def _backward_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    residual: Tensor | None,
    mean: Tensor,
    stat: Tensor,
    bits: Tensor,
    eps: float,
    training: bool,
    activation: str,
    res_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias, d_residual); dweight/dbias in the statistics dtype. bias and
    residual are read by the smooth activations only (None otherwise); their d_residual is
    full exactly when a residual is given (then res_grad is set)."""
    args = (x, weight, bias, residual, mean, stat, bits, eps, training, activation, res_grad)
    return _backward_parts(dy, None, *args)


def _backward_parts(dy: Tensor, dy2: Tensor | None, *args) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """_backward_impl's result (`args`: its arguments after dy) for the output gradient
    dy + dy2 (`dy2` None: dy alone); ReLU and no activation read the two parts in their
    kernels."""
    x, weight, bias, residual, mean, stat, bits, eps, training, activation, res_grad = args
    relu = activation == "relu"
    if x.numel() == 0:
        zeros = torch.zeros_like(mean)
        dres = torch.empty_like(x) if res_grad else x.new_empty((0,))
        return torch.empty_like(x), zeros, zeros.clone(), dres
    if activation in ACT_CODES:
        dy = dy if dy2 is None else dy + dy2
        args = (dy, x, weight, bias, residual, mean, stat, eps, training)
        if use_triton(x):
            return launch.act_backward(*args, ACT_CODES[activation])
        return _act_backward_ref(*args, activation)
    args = (dy, x, weight, mean, stat, bits, eps, training, relu, res_grad, dy2)
    if use_triton(x):
        return launch.backward(*args)
    return _backward_ref(*args)


def _save(ctx, inputs, bits: Tensor) -> None:
    x, mean, stat, weight, bias, residual, eps, training, activation = inputs
    if activation in ACT_CODES:  # the backward recomputes the pre-activation from these
        ctx.save_for_backward(x, weight, mean, stat, bits, bias, residual)
    else:
        ctx.save_for_backward(x, weight, mean, stat, bits, None, None)
    ctx.eps, ctx.training, ctx.activation = eps, training, activation
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.has_residual = residual is not None


def _input_grads(ctx, dy: Tensor, backward_fn, dy2: Tensor | None = None) -> tuple:
    """Gradients for (x, mean, stat, weight, bias, residual, eps, training, activation), of the
    output gradient dy (+ dy2: then `_backward_parts` runs, not backward_fn)."""
    x, weight, mean, stat, bits, bias, residual = ctx.saved_tensors
    identity = ctx.activation == "none" and dy2 is None  # then d_residual is dy itself
    args = (x, weight, bias, residual, mean, stat, bits, ctx.eps, ctx.training, ctx.activation)
    res_grad = ctx.has_residual and not identity
    if dy2 is None:
        dx, dw, db, dres = backward_fn(dy, *args, res_grad)
    else:
        dx, dw, db, dres = _backward_parts(dy, dy2, *args, res_grad)
    dweight = None if weight is None else dw if dw.dtype == weight.dtype else dw.to(weight.dtype)
    bias_dtype = ctx.bias_dtype
    dbias = None if bias_dtype is None else db if db.dtype == bias_dtype else db.to(bias_dtype)
    dresidual = (dy if identity else dres) if ctx.has_residual else None
    return dx, None, None, dweight, dbias, dresidual, None, None, None


def _forward(
    x,
    weight,
    bias,
    running_mean,
    running_var,
    residual,
    training: bool,
    momentum: float,
    eps: float,
    activation: str,
) -> tuple[Tensor, ...]:
    """(y, mean, stat, mask bits) of the eager path: one plan lookup for both kernels."""
    if x.numel() == 0 or not use_triton(x):
        if training:
            mean, stat = _stats(x, running_mean, running_var, momentum, eps)
        else:
            mean, stat = running_mean.to(launch.stat_dtype(x)), running_var
        y, bits = _apply(x, mean, stat, weight, bias, residual, eps, training, activation)
        return y, mean, stat, bits
    relu, act = activation == "relu", ACT_CODES.get(activation, 0)
    plan = launch.forward_plan(
        x, weight, bias, running_mean, running_var, residual, training, relu, act
    )
    if training:
        mean, stat = plan.stats(x, running_mean, running_var, momentum, eps)
    else:
        mean, stat = running_mean.to(plan.acc), running_var
    y, bits = plan.apply(x, mean, stat, weight, bias, residual, eps)
    return y, mean, stat, bits


class _BatchNormActFn(torch.autograd.Function):
    """The eager path: statistics and the fused pass in one Function, no custom-op dispatch
    (its Python costs more than these kernels take at ResNet's smaller stages)."""

    @staticmethod
    def forward(
        ctx,
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
        anchor,
    ):
        y, mean, stat, bits = _forward(
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
        )
        _save(ctx, (x, mean, stat, weight, bias, residual, eps, training, activation), bits)
        ctx.set_materialize_grads(False)  # dy is None when every user handed its part over
        ctx.handed_over = []  # residual gradients of this output, from its users' backward
        ctx.residual_ref = None if anchor is None else weakref.ref(residual)
        return y

    @staticmethod
    def backward(ctx, dy):
        parts = ctx.handed_over
        if parts:
            dy2 = parts[0] if len(parts) == 1 else torch.stack(parts).sum(0)
            parts.clear()
            dy, dy2 = (dy2, None) if dy is None else (dy, dy2)
        elif dy is None:  # no gradient reached this output
            return (None,) * 11
        else:
            dy2 = None
        dx, _, _, dweight, dbias, dresidual, *_ = _input_grads(ctx, dy, _backward_impl, dy2)
        if dresidual is not None and _hand_over(ctx, dresidual):
            dresidual = None
        return dx, dweight, dbias, None, None, dresidual, None, None, None, None, None


_ANCHORS: dict[torch.device, Tensor] = {}


def handover_anchor(residual: Tensor | None) -> Tensor | None:
    """The extra input of a `_BatchNormActFn` call whose residual may hand its gradient over:
    `residual` is another call's output as it stands (its grad_fn is that call's node). It is a
    scalar leaf that requires grad and is never anyone's `inputs=`: the engine will run its
    node exactly when the backward runs the whole graph (`.backward()` with no `inputs`), the
    one case where every producer runs and none has its output's gradient captured."""
    if residual is None or not residual.requires_grad:
        return None
    if type(residual.grad_fn) is not _BACKWARD_NODE:
        return None
    anchor = _ANCHORS.get(residual.device)
    if anchor is None:
        anchor = _ANCHORS[residual.device] = torch.zeros((), device=residual.device)
        anchor.requires_grad_()
    return anchor


def _hand_over(ctx, dresidual: Tensor) -> bool:
    """Append the residual's gradient to its producer's node instead of returning it, where
    that is safe (see the module docstring); True when it was handed over."""
    residual = ctx.residual_ref() if ctx.residual_ref is not None else None
    if residual is None or residual._backward_hooks or residual.retains_grad:
        return False
    node = residual.grad_fn
    if type(node) is not _BACKWARD_NODE:  # changed in place since
        return False
    anchor_node = ctx.next_functions[-1][0]  # the anchor: the last tensor input
    if anchor_node is None or not torch._C._will_engine_execute_node(anchor_node):
        return False  # autograd.grad or backward(inputs=...): outputs may be captured
    node.handed_over.append(dresidual)
    return True


class _HandOverFn(torch.autograd.Function):
    """x as another user of it sees it (a view); its gradient from that user is handed over to
    the `_BatchNormActFn` call that produced x, as a residual's is (`hand_over`)."""

    @staticmethod
    def forward(ctx, x, anchor):
        ctx.set_materialize_grads(False)
        ctx.residual_ref = weakref.ref(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if g is None or _hand_over(ctx, g):
            return None, None
        return g, None


def hand_over(x: Tensor) -> Tensor:
    """x for one more of its users: where x is a fused norm's output (`_BatchNormActFn`), that
    user's gradient reaches the norm's backward as a second part, read in its kernels, instead
    of through autograd's add (a ResNet block's input feeding both its first convolution and
    its downsampling branch). x itself otherwise, and under torch.compile."""
    if torch.compiler.is_compiling():
        return x
    anchor = handover_anchor(x)
    return x if anchor is None else _HandOverFn.apply(x, anchor)


_BACKWARD_NODE = _BatchNormActFn._backward_cls


# ---- custom ops: what torch.compile traces (fake implementations, registered autograd) ----

batch_norm_stats = torch.library.custom_op(
    "gpushape::batch_norm_stats", _stats, mutates_args=("running_mean", "running_var")
)
batch_norm_act_apply = torch.library.custom_op(
    "gpushape::batch_norm_act_apply", _apply, mutates_args=()
)
batch_norm_act_backward = torch.library.custom_op(
    "gpushape::batch_norm_act_backward", _backward_impl, mutates_args=()
)


@batch_norm_stats.register_fake
def _(x, running_mean, running_var, momentum, eps):
    mean = x.new_empty(x.shape[1], dtype=launch.stat_dtype(x))
    return mean, torch.empty_like(mean)


@batch_norm_act_apply.register_fake
def _(x, mean, stat, weight, bias, residual, eps, training, activation):
    n, c, h, w = x.shape
    shape = (n * h * w, (c + 7) // 8) if activation == "relu" else (0,)
    return torch.empty_like(x), x.new_empty(shape, dtype=torch.uint8)


@batch_norm_act_backward.register_fake
def _(dy, x, weight, bias, residual, mean, stat, bits, eps, training, activation, res_grad):
    dres = torch.empty_like(x) if res_grad else x.new_empty((0,))
    return torch.empty_like(x), torch.empty_like(mean), torch.empty_like(mean), dres


def _setup_context(ctx, inputs, output):
    _save(ctx, inputs, output[1])
    ctx.mark_non_differentiable(output[1])


batch_norm_act_apply.register_autograd(
    lambda ctx, dy, _dbits: _input_grads(ctx, dy, batch_norm_act_backward),
    setup_context=_setup_context,
)
