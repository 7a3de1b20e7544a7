"""Launch plans of the row-norm kernels: everything a launch needs that depends only on the
shape, dtypes, flags, device and tuning (grids, constexprs, warps, the backward's program count),
built once per key and kept in a dict, so a call only allocates its outputs and launches.

Host cost matters here: at 32768 x 4096 bf16 the GPU needs ~0.4 ms for forward + backward;
launches go through `_launch.Launch`, which skips Triton's per-call JIT dispatch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .._launch import Launch
from ._reference import GELU_ERF, stat_dtype
from ._tuning import NormTuning, bwd_config, cdiv, fwd_config, num_warps_for, pow2, tuning

_INTERPRETER_SMS = 2  # the interpreter runs programs one by one: few persistent programs


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`, read once per device."""
    if device.type == "cuda":
        return _cuda_sm_count(
            device.index if device.index is not None else torch.cuda.current_device()
        )
    return _INTERPRETER_SMS


def _fast_gelu(act: int, dtype: torch.dtype, t: NormTuning) -> bool:
    """bfloat16 output: the exact GELU's normal CDF comes from a logistic fit (max abs error
    1.4e-4, 1/28 of a bfloat16 unit in [0.5, 1)) instead of erf. By sm_90 SASS count erf is ~34
    of the forward's ~51 instructions per element, more than a 2-byte-in, 2-byte-out kernel can
    issue at full HBM bandwidth; the fit costs ~12. float16 and float32 keep erf: their units
    are 8x and 65536x finer."""
    return act == GELU_ERF and dtype == torch.bfloat16 and t.bf16_fast_gelu


def _tl_acc(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _key(x, w, b, extra, act, rms) -> tuple:
    """What a plan depends on. The tuning object's id: `norm_tuning` swaps it, and the plan
    keeps a reference, so the id is not reused while the plan is cached."""
    return (
        x.shape,
        x.dtype,
        x.get_device(),
        None if w is None else w.dtype,
        None if b is None else b.dtype,
        extra,
        act,
        rms,
        id(tuning()),
    )


# ---- forward ---------------------------------------------------------------------------------
class ForwardPlan(NamedTuple):
    launch: Launch
    looped: bool  # the looped kernel takes no M (one row per program)
    acc: torch.dtype  # statistics dtype
    lead: torch.Size  # x.shape[:-1]: the statistics' shape
    tuning: NormTuning  # keeps id(tuning) in the key valid


_FWD: dict[tuple, ForwardPlan] = {}


def forward_plan(x, has_r, w, b, *, act: int, rms: bool) -> ForwardPlan:
    key = _key(x, w, b, has_r, act, rms)
    plan = _FWD.get(key)
    if plan is None:
        plan = _FWD[key] = _build_forward(x, has_r, w, b, act, rms)
    return plan


def _build_forward(x, has_r, w, b, act, rms) -> ForwardPlan:
    from ._kernels import _norm_fwd_looped_kernel, _norm_fwd_tile_kernel

    n = x.shape[-1]
    m = x.numel() // n
    t = tuning()
    flags = dict(
        ACT=act,
        FAST=_fast_gelu(act, x.dtype, t),
        IS_RMS=rms,
        HAS_RESIDUAL=has_r,
        HAS_W=w is not None,
        HAS_B=b is not None,
        ACC=_tl_acc(x.dtype),
    )
    cfg = fwd_config(m, n, t) if pow2(n) <= t.fwd_max_block_n else None
    if cfg is not None and cfg.block_n == 0:
        launch = Launch(
            _norm_fwd_tile_kernel,
            (cdiv(m, cfg.block_m),),
            dict(
                flags,
                BLOCK_M=cfg.block_m,
                BLOCK_N=pow2(n),
                EVEN_N=n == pow2(n),
                num_warps=cfg.num_warps,
            ),
        )
    else:
        block_n = min(cfg.block_n if cfg is not None else t.looped_block_n, pow2(n))
        warps = (
            cfg.num_warps if cfg is not None else num_warps_for(block_n, t.fwd_elems_per_thread, t)
        )
        launch = Launch(
            _norm_fwd_looped_kernel, (m,), dict(flags, BLOCK_N=block_n, num_warps=warps)
        )
    return ForwardPlan(
        launch, launch.kernel is _norm_fwd_looped_kernel, stat_dtype(x.dtype), x.shape[:-1], t
    )


# ---- backward --------------------------------------------------------------------------------
class BackwardPlan(NamedTuple):
    row_sums: Launch | None  # looped path only: the row means dx needs, first
    main: Launch  # dx and the per-program dweight / dbias partials
    sum_partials: Launch | None  # (P, N) partials -> (N,) dweight / dbias; None without params
    programs: int  # P
    tiles_per_program: int
    acc: torch.dtype
    tuning: NormTuning


_BWD: dict[tuple, BackwardPlan] = {}


def backward_plan(
    x, ds_key: tuple[bool, torch.dtype], w, b, *, act: int, rms: bool
) -> BackwardPlan:
    """ds_key: (whether ds is given, dy's dtype)."""
    key = _key(x, w, b, ds_key, act, rms)
    plan = _BWD.get(key)
    if plan is None:
        plan = _BWD[key] = _build_backward(x, ds_key[0], w, b, act, rms)
    return plan


def _build_backward(x, has_ds, w, b, act, rms) -> BackwardPlan:
    from ._kernels import _norm_bwd_kernel, _norm_bwd_row_sums_kernel

    n = x.shape[-1]
    m = x.numel() // n
    t = tuning()
    flags = dict(
        ACT=act,
        FAST=_fast_gelu(act, x.dtype, t),
        IS_RMS=rms,
        HAS_W=w is not None,
        HAS_B=b is not None,
        ACC=_tl_acc(x.dtype),
    )
    cfg = bwd_config(m, n, t) if pow2(n) <= t.bwd_max_block_n else None
    single = cfg is not None and cfg.block_n == 0
    row_sums = None
    if single:
        block_m, block_n, col_blocks = cfg.block_m, pow2(n), 1
        warps, per_sm, prefetch, reload_wb = (
            cfg.num_warps,
            cfg.programs_per_sm,
            cfg.prefetch,
            cfg.reload_wb,
        )
    else:
        block_m, block_n = 1, min(cfg.block_n if cfg is not None else t.looped_block_n, pow2(n))
        warps = (
            cfg.num_warps if cfg is not None else num_warps_for(block_n, t.bwd_elems_per_thread, t)
        )
        col_blocks, reload_wb = cdiv(n, block_n), False
        per_sm = cfg.programs_per_sm if cfg is not None else max(1, t.bwd_warps_per_sm // warps)
        prefetch = cfg.prefetch if cfg is not None else 1
        row_sums = Launch(
            _norm_bwd_row_sums_kernel, (m,), dict(flags, BLOCK_N=block_n, num_warps=warps)
        )
    tiles = cdiv(m, block_m)
    programs = max(1, min(tiles, cdiv(sm_count(x.device) * per_sm, col_blocks)))
    tiles_per_program = cdiv(tiles, programs)
    programs = cdiv(tiles, tiles_per_program)  # no program without a tile
    main = Launch(
        _norm_bwd_kernel,
        (programs, col_blocks),
        dict(
            flags,
            HAS_DS=has_ds,
            STATS_GIVEN=not single,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            EVEN_N=n % block_n == 0,
            PREFETCH=prefetch,
            RELOAD_WB=reload_wb,
            num_warps=warps,
        ),
    )
    acc = stat_dtype(x.dtype)
    return BackwardPlan(
        row_sums, main, _sum_launch(programs, n, w, b, acc, t), programs, tiles_per_program, acc, t
    )


def _sum_launch(p: int, n: int, w, b, acc: torch.dtype, t: NormTuning) -> Launch | None:
    """dweight and dbias from the (P, N) float32 partials in one launch."""
    from ._kernels import _sum_partials_kernel

    if w is None and b is None:
        return None
    block_n = min(t.sum_block_n, pow2(n))  # narrow column tiles: many programs share the read
    return Launch(
        _sum_partials_kernel,
        (cdiv(n, block_n),),
        dict(
            HAS_W=w is not None,
            HAS_B=b is not None,
            ACC=_tl_acc(acc),
            BLOCK_P=min(t.sum_block_p, pow2(p)),
            BLOCK_N=block_n,
            num_warps=4,
        ),
    )
