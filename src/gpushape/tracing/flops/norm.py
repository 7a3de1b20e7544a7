"""Normalizations, softmax, dropout, NLL loss: per-element FLOP counts, written out.

n = elements of the normalized input. FLOPs per element ("affine": a weight or bias is given):
- batch / layer / group norm forward with statistics: 5 (+2 affine): sum, square, sum of
  squares; subtract the mean, multiply by rstd; (x weight, + bias).
- batch norm forward with running statistics (eval): 2 (+2 affine): subtract, multiply.
- batch / layer / group norm backward: 8 for the input gradient (x_hat 2, dy x weight 1, two
  row sums 2, combine 3), +3 when weight/bias gradients are asked (dy x x_hat and its sum,
  sum of dy). Batch norm (its sums before any dx) and layer norm (its weight gradients after
  the input gradient, when both are asked) read x and dy twice: reread_bytes.
  Batch norm backward in eval: 2 (dy x weight x rstd).
- RMS norm forward: 3 (+1 weight): square, sum; multiply by rstd; (x weight).
  Backward: 6 (x_hat 1, dy x weight 1, row sum of dy x x_hat 2, combine 2), +2 for the weight.
- softmax / log_softmax forward: 5: max, subtract, exp, sum, divide (or subtract the log-sum).
  Backward: 4: dy x y and its row sum, subtract, multiply (log_softmax: exp, sum, x, subtract).
- dropout forward (training): 2: compare the draw with p, multiply by mask / (1 - p).
  Backward: 1: multiply by the scaled mask.
- nll_loss forward: 1 per target: gather its log-probability and sum.

Per-row work (mean and rstd, once per normalized row) is lower order and not counted. Kernels:
training batch norm launches two (statistics, then normalize), as do the norm backwards (input
gradient, then weight gradients).
"""

from __future__ import annotations

import dataclasses

from ..records import OpRecord
from .registry import OpWork, io_bytes, register_formula


def _n(rec: OpRecord) -> int:
    return rec.inputs[0].numel


def _affine(rec: OpRecord) -> bool:
    return rec.has_input("weight") or rec.has_input("bias")


@register_formula(
    "aten.native_batch_norm",
    "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_no_training",
    "aten.cudnn_batch_norm",
    "aten.miopen_batch_norm",
    "aten._batch_norm_with_update",
    "aten._batch_norm_no_update",
)
def batch_norm(rec: OpRecord) -> OpWork:
    training = bool(rec.params.get("training", rec.op.startswith("aten._batch_norm_with_update")))
    per = (5 if training else 2) + (2 if _affine(rec) else 0)
    if not training:
        return OpWork(flops=per * _n(rec), min_bytes=io_bytes(rec))
    # Two passes: per-channel statistics over the whole batch, then normalise: x is read twice.
    return OpWork(
        flops=per * _n(rec),
        min_bytes=io_bytes(rec),
        kernels=2,
        reread_bytes=rec.input("input").nbytes,
    )


@register_formula("aten.native_layer_norm", "aten.native_group_norm")
def layer_norm(rec: OpRecord) -> OpWork:
    per = 5 + (2 if _affine(rec) else 0)
    return OpWork(flops=per * _n(rec), min_bytes=io_bytes(rec))


def _norm_backward(rec: OpRecord, input_name: str, per_dx: int, per_dw: int) -> OpWork:
    n = rec.input(input_name).numel
    mask = tuple(rec.params.get("output_mask", (True, True, True)))
    per = (per_dx if mask[0] else 0) + (per_dw if any(mask[1:]) else 0)
    return OpWork(flops=per * n, min_bytes=io_bytes(rec), kernels=2 if any(mask[1:]) else 1)


@register_formula(
    "aten.native_batch_norm_backward",
    "aten.batch_norm_backward",
    "aten.cudnn_batch_norm_backward",
    "aten.miopen_batch_norm_backward",
)
def batch_norm_backward(rec: OpRecord) -> OpWork:
    train = bool(rec.params.get("train", rec.params.get("update", True)))
    if not train:
        return OpWork(flops=2 * rec.input("input").numel, min_bytes=io_bytes(rec))
    # Two passes: the per-channel sums of dy and dy * x_hat over the batch must be complete
    # before any dx is written, so x and dy are read twice.
    work = _norm_backward(rec, "input", 8, 3)
    reread = rec.input("input").nbytes + rec.input("grad_out").nbytes
    return dataclasses.replace(work, reread_bytes=reread)


@register_formula("aten.native_layer_norm_backward")
def layer_norm_backward(rec: OpRecord) -> OpWork:
    """The weight and bias gradients come from a second kernel that reads dy and x again
    after the input gradient's (tracing/norm_grads.py: where it runs, and how fast)."""
    work = _norm_backward(rec, "input", 8, 3)
    mask = tuple(rec.params.get("output_mask", (True, True, True)))
    if not (mask[0] and any(mask[1:])):  # one kernel: its reads are the minimum bytes
        return work
    reread = rec.input("input").nbytes + rec.input("grad_out").nbytes
    return dataclasses.replace(work, reread_bytes=reread)


@register_formula("aten.native_group_norm_backward")
def group_norm_backward(rec: OpRecord) -> OpWork:
    """Per-group sums first, the weight gradients from those: no second read of x."""
    return _norm_backward(rec, "input", 8, 3)


@register_formula("aten._fused_rms_norm")
def rms_norm(rec: OpRecord) -> OpWork:
    per = 3 + (1 if rec.has_input("weight") else 0)
    return OpWork(flops=per * _n(rec), min_bytes=io_bytes(rec))


@register_formula("aten._fused_rms_norm_backward")
def rms_norm_backward(rec: OpRecord) -> OpWork:
    return _norm_backward(rec, "input", 6, 2)


@register_formula("aten._softmax", "aten._log_softmax", "aten._safe_softmax")
def softmax(rec: OpRecord) -> OpWork:
    return OpWork(flops=5 * _n(rec), min_bytes=io_bytes(rec))


@register_formula("aten._softmax_backward_data", "aten._log_softmax_backward_data")
def softmax_backward(rec: OpRecord) -> OpWork:
    return OpWork(flops=4 * _n(rec), min_bytes=io_bytes(rec))


@register_formula("aten.native_dropout")
def dropout(rec: OpRecord) -> OpWork:
    """Training: reads x, writes y and the boolean mask kept for backward."""
    train = rec.params.get("train", True)
    if train is False:  # native_dropout(train=False) is a copy
        return OpWork(flops=0, min_bytes=io_bytes(rec))
    return OpWork(flops=2 * _n(rec), min_bytes=io_bytes(rec))


@register_formula("aten.native_dropout_backward")
def dropout_backward(rec: OpRecord) -> OpWork:
    return OpWork(flops=_n(rec), min_bytes=io_bytes(rec))


@register_formula("aten.nll_loss_forward", "aten.nll_loss2d_forward")
def nll_loss(rec: OpRecord) -> OpWork:
    """Reads the targets and one log-probability per target, not the whole input."""
    target = rec.input("target")
    logp = rec.input("self")
    read = target.nbytes + target.numel * logp.itemsize
    weight = rec.input("weight").nbytes if rec.has_input("weight") else 0
    return OpWork(flops=target.numel, min_bytes=read + weight + sum(t.nbytes for t in rec.outputs))


@register_formula("aten.nll_loss_backward", "aten.nll_loss2d_backward")
def nll_loss_backward(rec: OpRecord) -> OpWork:
    """Writes the whole gradient (zeros but one per row); reads targets, not the input."""
    return OpWork(flops=rec.input("target").numel, min_bytes=io_bytes(rec, skip=("self",)))


@register_formula("gpushape.global_response_norm")
def global_response_norm(rec: OpRecord) -> OpWork:
    """gpushape's GRN forward (kernels/grn): the per-channel sums of squares over the pixels,
    then y = x * scale + bias: x read twice, three kernels. 4 FLOPs an element (square, add;
    multiply, add)."""
    x = rec.inputs[0]
    return OpWork(flops=4 * x.numel, min_bytes=io_bytes(rec), kernels=3, reread_bytes=x.nbytes)


@register_formula("gpushape.global_response_norm_backward")
def global_response_norm_backward(rec: OpRecord) -> OpWork:
    """Its backward: the sums of dy * x and dy, then dx = dy * scale + x * coef: dy and x read
    twice, four kernels (the last adds the samples' parameter-gradient terms). 6 FLOPs an
    element."""
    dy, x = rec.inputs[0], rec.inputs[1]
    reread = dy.nbytes + x.nbytes
    return OpWork(flops=6 * x.numel, min_bytes=io_bytes(rec), kernels=4, reread_bytes=reread)


@register_formula("gpushape.group_norm_act")
def group_norm_act(rec: OpRecord) -> OpWork:
    """gpushape's group norm with its activation (kernels/group_norm): the per-channel shifted
    sums over the pixels, the groups' statistics, then y = act(x * scale + shift): x read
    twice, three kernels. 6 FLOPs an element (subtract, square, two adds; multiply, add), the
    activation's besides."""
    x = rec.inputs[0]
    return OpWork(flops=6 * x.numel, min_bytes=io_bytes(rec), kernels=3, reread_bytes=x.nbytes)


@register_formula("gpushape.group_norm_act_backward")
def group_norm_act_backward(rec: OpRecord) -> OpWork:
    """Its backward: the sums of dz and dz * (x - mean), then dx = dz * scale + x * coef +
    const, with the activation's gradient dz recomputed from x: dy and x read twice, four
    kernels (the last adds the samples' parameter-gradient terms). 8 FLOPs an element."""
    dy, x = rec.inputs[0], rec.inputs[1]
    reread = dy.nbytes + x.nbytes
    return OpWork(flops=8 * x.numel, min_bytes=io_bytes(rec), kernels=4, reread_bytes=reread)
