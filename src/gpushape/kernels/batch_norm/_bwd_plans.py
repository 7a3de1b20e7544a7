"""The backward's launch plans of batch_norm_act (the forward's and the shared pieces:
`_plans.py`): the reduction of dz and dz * x-hat per channel, then dx (and the residual's
gradient) elementwise. `BackwardPlan`: ReLU (its saved mask) and no activation;
`ActBackwardPlan`: the smooth activations, whose pre-activation is recomputed."""

from __future__ import annotations

import torch

from .._launch import aligned
from ._act_bwd_kernels import _act_bwd_apply_kernel, _act_bwd_reduce_kernel
from ._bwd_apply_kernels import _bwd_apply_kernel
from ._bwd_kernels import _bwd_finalize_kernel, _bwd_reduce_kernel
from ._plans import (
    View,
    _elementwise,
    _finalize_launch,
    _Layout,
    _Reduction,
    tiles,
)
from ._runtime import counters
from ._tuning import BatchNormTuning


class BackwardPlan(_Layout):
    """The backward of one signature: a reduction (sums; in eval also dx) and, when training,
    the elementwise dx pass."""

    def __init__(
        self,
        x,
        view: View,
        tuning: BatchNormTuning,
        weight,
        stat,
        training: bool,
        relu: bool,
        res_grad: bool,
        fold: bool = False,
    ):
        super().__init__(x, view)
        self.training, self.res_grad, self.has_w = training, res_grad, weight is not None
        self.fold = fold
        xk = self.kin(x)
        self.reduce_tiles = t = tiles(
            view, x.element_size(), tuning.bwd_reduce.tile_bytes, tuning.bwd_reduce.block_c
        )
        flags = dict(
            HAS_W=weight is not None, HAS_RES=res_grad, RELU=relu, CHANNELS_LAST=view.channels_last
        )
        acc = self.example()
        w = weight if weight is not None else acc
        bits = self.example(torch.uint8, view.NB * 16)
        example = [
            xk,
            xk,
            xk,
            bits,
            acc,
            self.example(stat.dtype),
            w,
            acc,
            counters(xk, t.n_cb),
            acc,
            acc,
            xk,
            xk,
            xk,
            view.C,
            view.L,
            view.NB,
            t.n_rb,
            1,
            1e-5,
        ]
        self.reduction = r = _Reduction(
            _bwd_reduce_kernel,
            example,
            dict(flags, EVAL=not training, HAS_DY2=fold, WRITE_DZ=fold and training),
            t,
            tuning.bwd_reduce,
        )
        self.finalize = (
            None
            if r.fused
            else _finalize_launch(_bwd_finalize_kernel, view.C, STAT_IS_VAR=not training)
        )
        self.apply_tiles = a = tiles(
            view, x.element_size(), tuning.bwd_apply.tile_bytes, tuning.bwd_apply.block_c
        )
        example = [
            xk,
            xk,
            bits,
            acc,
            acc,
            w,
            acc,
            acc,
            xk,
            xk,
            view.C,
            view.L,
            view.NB,
            a.n_rb,
            1,
            view.M,
        ]
        if fold:  # the reduction wrote dz: the plain pass reads it (no mask, no d_residual)
            flags = dict(flags, HAS_RES=False, RELU=False)
        self.apply_launch, self.apply_g = _elementwise(
            _bwd_apply_kernel, example, flags, a, tuning.bwd_apply, 14
        )

    def sums(self, ok: bool, dyk, dy2k, xk, weight, mean, stat, bits, eps: float, dxk, dresk, dzk):
        """(dweight, dbias) in the statistics dtype; in eval also writes dx, d_residual; with a
        second gradient in training, dz. `ok`: the caller's tensors are 16-byte aligned
        (runtime.aligned)."""
        v, t, r = self.view, self.reduce_tiles, self.reduction
        part = torch.empty((2 * r.P, v.C), dtype=self.acc, device=self.device)
        dw, db = torch.empty_like(mean), torch.empty_like(mean)
        w = weight if weight is not None else mean
        r.launch(
            ok,
            dyk,
            dy2k,
            xk,
            bits,
            mean,
            stat,
            w,
            part,
            counters(xk, t.n_cb),
            dw,
            db,
            dxk,
            dresk,
            dzk,
            v.C,
            v.L,
            v.NB,
            t.n_rb,
            r.P,
            eps,
        )
        if self.finalize is not None:
            self.finalize(ok, part, mean, stat, dw, db, v.C, r.P, eps)
        return dw, db

    def grads(self, ok: bool, dyk, xk, weight, mean, rstd, bits, dw, db, dxk, dresk) -> None:
        """dx (and d_residual) of training, from the sums."""
        v, a = self.view, self.apply_tiles
        w = weight if weight is not None else mean
        self.apply_launch(
            ok,
            dyk,
            xk,
            bits,
            mean,
            rstd,
            w,
            dw,
            db,
            dxk,
            dresk,
            v.C,
            v.L,
            v.NB,
            a.n_rb,
            self.apply_g,
            v.M,
        )

    def run(self, dy, x, weight, mean, stat, bits, eps: float, dy2=None):
        """(dx, dweight, dbias, d_residual); `dy2`: the output gradient's second part (a plan
        built with `fold`), added to dy inside the kernels."""
        ok = aligned(dy, dy2, x, weight, mean, stat, bits)
        xk, dyk = self.kin(x), self.kin(dy)
        dy2k = self.kin(dy2) if self.fold else dyk
        dx, dxk = self.out(x)
        dres, dresk = self.out(x) if self.res_grad else (x.new_empty((0,)),) * 2
        dresk_or_dx = dresk if self.res_grad else dxk
        # the fold's dz: d_residual itself when there is one, else a buffer of its own
        dzk = (dresk if self.res_grad else torch.empty_like(xk)) if self.fold else dxk
        dw, db = self.sums(ok, dyk, dy2k, xk, weight, mean, stat, bits, eps, dxk, dresk_or_dx, dzk)
        if self.training and self.fold:  # dz for dy and the mask; nothing more to write
            self.grads(ok, dzk, xk, weight, mean, stat, bits, dw, db, dxk, dxk)
        elif self.training:
            self.grads(ok, dyk, xk, weight, mean, stat, bits, dw, db, dxk, dresk_or_dx)
        for out, buf in ((dx, dxk), (dres, dresk)):
            if buf is not out:
                out.copy_(buf)
        return dx, dw, db, dres


class ActBackwardPlan(_Layout):
    """The backward of a smooth activation (`act`: its code in `_act_math.ACT_CODES`), the
    pre-activation recomputed (`_act_bwd_kernels.py`): a reduction (sums; dz as d_residual when
    there is a residual; in eval also dx) and, when training, the dx pass, which recomputes dz
    from dy and x, or, with a residual, reads it back from d_residual through the plain
    `_bwd_apply_kernel` (no activation, no residual gradient of its own)."""

    def __init__(
        self, x, view: View, tuning: BatchNormTuning, weight, bias, stat, training, act, has_res
    ):
        super().__init__(x, view)
        self.training, self.has_res = training, has_res
        xk, acc = self.kin(x), self.example()
        self.no_bits = torch.empty(0, dtype=torch.uint8, device=self.device)
        self.reduce_tiles = t = tiles(
            view, x.element_size(), tuning.bwd_reduce.tile_bytes, tuning.bwd_reduce.block_c
        )
        w = weight if weight is not None else acc
        b = bias if bias is not None else acc
        flags = dict(
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            ACT=act,
            CHANNELS_LAST=view.channels_last,
        )
        # dy, x, res, mean, stat, w, b, part, count, dw, db, dx, dres, C, L, n_rb, P, eps
        example = [xk, xk, xk, acc, self.example(stat.dtype), w, b, acc, counters(xk, t.n_cb)]
        example += [acc, acc, xk, xk, view.C, view.L, t.n_rb, 1, 1e-5]
        self.reduction = r = _Reduction(
            _act_bwd_reduce_kernel,
            example,
            dict(flags, EVAL=not training, HAS_RES=has_res),
            t,
            tuning.bwd_reduce,
        )
        self.finalize = (
            None
            if r.fused
            else _finalize_launch(_bwd_finalize_kernel, view.C, STAT_IS_VAR=not training)
        )
        if training:
            self._plan_dx(xk, tuning, flags, w, b)

    def _plan_dx(self, xk, tuning: BatchNormTuning, flags: dict, w, b) -> None:
        v, acc = self.view, self.example()
        self.apply_tiles = a = tiles(
            v, xk.element_size(), tuning.bwd_apply.tile_bytes, tuning.bwd_apply.block_c
        )
        if self.has_res:  # dz is in d_residual: the plain dx pass (no activation) reads it
            meta = dict(
                HAS_W=flags["HAS_W"], HAS_RES=False, RELU=False, CHANNELS_LAST=v.channels_last
            )
            example = [xk, xk, self.no_bits, acc, acc, w, acc, acc, xk, xk]
            example += [v.C, v.L, v.NB, a.n_rb, 1, v.M]
            kernel, g_index = _bwd_apply_kernel, 14
        else:
            meta = flags
            example = [xk, xk, acc, acc, w, b, acc, acc, xk, v.C, v.L, a.n_rb, 1, v.M]
            kernel, g_index = _act_bwd_apply_kernel, 12
        self.apply_launch, self.apply_g = _elementwise(
            kernel, example, meta, a, tuning.bwd_apply, g_index
        )

    def run(self, dy, x, weight, bias, residual, mean, stat, eps: float):
        """(dx, dweight, dbias, d_residual); d_residual is empty without a residual."""
        v, t, r = self.view, self.reduce_tiles, self.reduction
        ok = aligned(dy, x, weight, bias, residual, mean, stat)
        xk, dyk = self.kin(x), self.kin(dy)
        resk = self.kin(residual) if self.has_res else xk
        dx, dxk = self.out(x)
        dres, dresk = self.out(x) if self.has_res else (x.new_empty((0,)),) * 2
        dresk_or_dx = dresk if self.has_res else dxk
        w = weight if weight is not None else mean
        b = bias if bias is not None else mean
        part = torch.empty((2 * r.P, v.C), dtype=self.acc, device=self.device)
        dw, db = torch.empty_like(mean), torch.empty_like(mean)
        args = (dyk, xk, resk, mean, stat, w, b, part, counters(xk, t.n_cb), dw, db, dxk)
        r.launch(ok, *args, dresk_or_dx, v.C, v.L, t.n_rb, r.P, eps)
        if self.finalize is not None:
            self.finalize(ok, part, mean, stat, dw, db, v.C, r.P, eps)
        if self.training:
            self._dx(ok, dyk, xk, dresk, w, b, mean, stat, dw, db, dxk)
        for out, buf in ((dx, dxk), (dres, dresk)):
            if buf is not out:
                out.copy_(buf)
        return dx, dw, db, dres

    def _dx(self, ok: bool, dyk, xk, dresk, w, b, mean, rstd, dw, db, dxk) -> None:
        v, a, g = self.view, self.apply_tiles, self.apply_g
        if self.has_res:
            args = (dresk, xk, self.no_bits, mean, rstd, w, dw, db, dxk, dxk, v.C, v.L, v.NB)
            self.apply_launch(ok, *args, a.n_rb, g, v.M)
        else:
            self.apply_launch(ok, dyk, xk, mean, rstd, w, b, dw, db, dxk, v.C, v.L, a.n_rb, g, v.M)
