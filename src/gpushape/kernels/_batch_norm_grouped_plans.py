"""Launch plans of batch_norm_act's one-kernel-a-direction path (`_batch_norm_grouped.py`):
training, channels_last, where a channel group's rows fit in L2.

`grouped_forward` / `grouped_backward` return None where the path does not apply (NCHW, eval,
groups that do not fit `GroupedConfig.l2_share` of the L2, the interpreter unless `force`); the
callers then take the two-kernel plans of `_batch_norm_plans.py`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ._batch_norm_grouped import _grouped_bwd_kernel, _grouped_fwd_kernel
from ._batch_norm_plans import View, _Layout, _pow2
from ._batch_norm_runtime import counters, resident_programs, sm_count
from ._batch_norm_tuning import GroupedConfig
from ._launch import Launch, aligned

@functools.cache
def l2_bytes(device_index: int) -> int:
    return getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 0)


@functools.cache
def _cooperative() -> dict:
    """Launch option for a cooperative grid (all programs resident) where Triton has it."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return {}
    fields = {f.name for f in dataclasses.fields(CUDAOptions)}
    return {"launch_cooperative_grid": True} if "launch_cooperative_grid" in fields else {}


def group_width(view: View, cfg: GroupedConfig, held_bytes_per_elem: float,
                l2: int) -> int | None:
    """Channels a group: the widest of block_c, block_c / 2, ... (>= min_block_c) whose lag + 1
    groups of held tensors fit l2_share of the L2; None when none does."""
    if not (cfg.enabled and view.channels_last and view.M > 0):
        return None
    bc = min(max(_pow2(cfg.block_c), 8), max(_pow2(view.C), 8))
    while True:
        held = (cfg.lag + 1) * bc * view.M * held_bytes_per_elem
        if cfg.force or held <= cfg.l2_share * l2:
            return bc
        if bc // 2 < max(cfg.min_block_c, 8):
            return None
        bc //= 2


class _Grouped(_Layout):
    """Grid, constexprs and compiled kernel of one grouped launch."""

    def __init__(self, x, view: View, cfg: GroupedConfig, block_c: int, kernel, example: list,
                 meta: dict):
        super().__init__(x, view)
        self.block_c = block_c
        self.n_g = -(-view.C // block_c)
        n_rb = -(-view.M // cfg.block_l)
        team = max(_pow2(cfg.team), 2)
        meta = dict(meta, LAG=cfg.lag, TEAM=team, BLOCK_L=cfg.block_l, BLOCK_C=block_c,
                    num_warps=cfg.warps)
        if x.is_cuda:
            meta.update(_cooperative())
            sms = sm_count(x.get_device())
            per_sm = resident_programs(kernel, example, meta) // sms
            p = sms * max(min(cfg.programs_per_sm, per_sm), 1)
        else:  # the interpreter runs programs one at a time: none may wait on another
            p = 1
        self.P = max(min(p, n_rb), 1)
        self.n_teams = -(-self.P // team)
        self.launch = Launch(kernel, self.P, meta)

    def scratch(self, x, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(partial sums, team sums, sync counters) of one launch."""
        c = self.view.C
        part = torch.empty((rows, c), dtype=self.acc, device=self.device)
        team = torch.empty((2 * self.n_teams, c), dtype=self.acc, device=self.device)
        return part, team, counters(x, self.n_g * (self.n_teams + 3))


class GroupedForward(_Grouped):
    """Statistics and y of a training forward in one launch."""

    def __init__(self, x, view, cfg, block_c, weight, bias, running_mean, residual, relu):
        self.update, self.relu = running_mean is not None, relu
        acc = torch.empty(view.C, dtype=_Layout(x, view).acc, device=x.device)
        xk = x if x.is_contiguous(memory_format=torch.channels_last) else torch.empty_like(
            x, memory_format=torch.channels_last)
        bits = torch.empty(max(view.NB * 16, 16), dtype=torch.uint8, device=x.device)
        example = [xk, xk, xk, bits, acc, acc, acc, acc, counters(xk, 3), acc, acc, acc, acc,
                   view.C, view.M, view.NB, 1, 1e-5, 0.1]
        meta = dict(HAS_W=weight is not None, HAS_B=bias is not None,
                    HAS_RES=residual is not None, RELU=relu, UPDATE=self.update)
        super().__init__(x, view, cfg, block_c, _grouped_fwd_kernel, example, meta)

    def run(self, x, weight, bias, running_mean, running_var, residual, momentum: float,
            eps: float):
        """(y, mean, rstd, mask bits); blends the running stats in place."""
        v = self.view
        xk = self.kin(x)
        res = self.kin(residual) if residual is not None else xk
        y, yk = self.out(x)
        mean = torch.empty(v.C, dtype=self.acc, device=self.device)
        rstd = torch.empty_like(mean)
        part, team, sync = self.scratch(x, 2 * self.P + 1)
        bits = torch.empty((v.M, v.NB) if self.relu else (0,), dtype=torch.uint8,
                           device=self.device)
        rm, rv = (running_mean, running_var) if self.update else (mean, rstd)
        self.launch(aligned(x, residual, weight, bias, running_mean, running_var), xk, res, yk,
                    bits, weight if weight is not None else mean,
                    bias if bias is not None else mean, part, team, sync, mean, rstd, rm, rv,
                    v.C, v.M, v.NB, self.P, eps, momentum)
        if yk is not y:
            y.copy_(yk)
        return y, mean, rstd, bits


class GroupedBackward(_Grouped):
    """dx, dweight, dbias (and d_residual) of a training backward in one launch."""

    def __init__(self, x, view, cfg, block_c, weight, relu, res_grad):
        acc = torch.empty(view.C, dtype=_Layout(x, view).acc, device=x.device)
        xk = x if x.is_contiguous(memory_format=torch.channels_last) else torch.empty_like(
            x, memory_format=torch.channels_last)
        bits = torch.empty(max(view.NB * 16, 16), dtype=torch.uint8, device=x.device)
        example = [xk, xk, bits, acc, acc, acc, acc, acc, counters(xk, 3), acc, acc, xk, xk,
                   view.C, view.M, view.NB, 1]
        meta = dict(HAS_W=weight is not None, HAS_RES=res_grad, RELU=relu)
        super().__init__(x, view, cfg, block_c, _grouped_bwd_kernel, example, meta)

    def run(self, ok: bool, dyk, xk, weight, mean, rstd, bits, dxk, dresk):
        """Writes dx (and d_residual) into dxk (dresk); returns (dweight, dbias)."""
        v = self.view
        dw, db = torch.empty_like(mean), torch.empty_like(mean)
        part, team, sync = self.scratch(xk, 2 * self.P)
        self.launch(ok, dyk, xk, bits, mean, rstd, weight if weight is not None else mean, part,
                    team, sync, dw, db, dxk, dresk, v.C, v.M, v.NB, self.P)
        return dw, db


def _l2(x: torch.Tensor) -> int:
    return l2_bytes(x.get_device()) if x.is_cuda else 0


def grouped_forward(x, view: View, cfg: GroupedConfig, weight, bias, running_mean, residual,
                    relu: bool) -> GroupedForward | None:
    bc = group_width(view, cfg, x.element_size(), _l2(x))
    if bc is None:
        return None
    return GroupedForward(x, view, cfg, bc, weight, bias, running_mean, residual, relu)


def grouped_backward(x, view: View, cfg: GroupedConfig, weight, relu: bool,
                     res_grad: bool) -> GroupedBackward | None:
    # phase 2 re-reads dy and x (and the mask bits: an eighth of a byte an element)
    bc = group_width(view, cfg, 2 * x.element_size() + (0.125 if relu else 0.0), _l2(x))
    if bc is None:
        return None
    return GroupedBackward(x, view, cfg, bc, weight, relu, res_grad)
