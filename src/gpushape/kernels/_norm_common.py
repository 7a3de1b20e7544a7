"""What the row-normalisation ops share: input checks, launch configuration, the Triton launchers
(the plain-PyTorch reference for CPU tensors is in _norm_reference.py) and the module base.

Every op here normalises over the last dimension of x, seen as M rows of N features:
    layer_norm_gelu: y = gelu(LN(x) * w + b)          (act=GELU_ERF / GELU_TANH, rms=False)
    add_layer_norm:  s = x + r; y = LN(s) * w + b     (residual given)
    rms_norm:        y = x * rstd(x) * w              (rms=True)
The forward saves only the (M,) statistics; the backward recomputes x_hat (and the activation's
input) from x, mean, rstd, weight and bias.
"""

from __future__ import annotations

import functools
import math

import torch

from ._dispatch import check_float, check_same_device, use_triton
from ._norm_reference import (
    GELU_ERF,
    NormBackward,
    NormForward,
    reference_backward,
    reference_forward,
    stat_dtype,
)
from ._norm_tuning import (  # noqa: F401  (norm_tuning, NormTuning: re-exported for callers)
    NormTuning,
    bwd_config,
    cdiv,
    fwd_config,
    norm_tuning,
    num_warps_for,
    pow2,
    tuning,
)

_SUPPORTED_DEVICES = ("cpu", "cuda", "meta")


# ---------------------------------------------------------------------------------------------
# input checks (run by the functional forms, before the custom op, so errors read plainly)
# ---------------------------------------------------------------------------------------------
def check_norm_inputs(op: str, x: torch.Tensor, weight: torch.Tensor | None,
                      bias: torch.Tensor | None, eps: float,
                      residual: torch.Tensor | None = None) -> None:
    tensors = {"x": x, "residual": residual, "weight": weight, "bias": bias}
    for name, t in tensors.items():
        if t is not None and t.device.type not in _SUPPORTED_DEVICES:
            raise RuntimeError(f"{op}: {name} is on {t.device}; expected CPU or CUDA tensors")
    check_same_device(op, **tensors)
    check_float(op, **tensors)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} has no features to normalise; "
                         f"the last dimension must hold at least one element")
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected ({n},) to match "
                             f"the last dimension of x {tuple(x.shape)}")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"{op}: residual has shape {tuple(residual.shape)}, expected x's "
                             f"shape {tuple(x.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"{op}: residual is {residual.dtype} but x is {x.dtype}; "
                            f"cast one so both match")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps!r}")


# ---------------------------------------------------------------------------------------------
# launch configuration (the data lives in _norm_tuning.py)
# ---------------------------------------------------------------------------------------------
@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`, read once per device. The Triton interpreter runs
    programs one by one: a small count there makes each persistent program loop over tiles."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else
                              torch.cuda.current_device())
    return 2


def _fast_gelu(act: int, dtype: torch.dtype) -> bool:
    """bfloat16 output: the exact GELU's normal CDF comes from a logistic fit (max abs error
    1.4e-4, 1/28 of a bfloat16 unit in [0.5, 1)) instead of erf. By sm_90 SASS count erf is ~34
    of the forward's ~51 instructions per element, more than a 2-byte-in, 2-byte-out kernel can
    issue at full HBM bandwidth; the fit costs ~12. float16 and float32 keep erf: their units
    are 8x and 65536x finer."""
    return act == GELU_ERF and dtype == torch.bfloat16 and tuning().bf16_fast_gelu


def _tl_acc(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _rows(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t.contiguous().view(-1, n)


def norm_forward(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                 bias: torch.Tensor | None, eps: float, *, act: int, rms: bool) -> NormForward:
    """Forward of every norm op: Triton on CUDA (and under TRITON_INTERPRET=1), else reference."""
    if not use_triton(x):
        return reference_forward(x, residual, weight, bias, eps, act=act, rms=rms)
    n = x.shape[-1]
    x2, r2 = _rows(x, n), _rows(residual, n)
    w, b = _rows(weight, n), _rows(bias, n)
    m = x2.shape[0]
    acc = stat_dtype(x.dtype)
    y = torch.empty_like(x2)
    s = torch.empty_like(x2) if residual is not None else None
    mean = None if rms else torch.empty(m, dtype=acc, device=x.device)
    rstd = torch.empty(m, dtype=acc, device=x.device)
    if m > 0:
        _launch_forward(x2, r2, s, y, w, b, mean, rstd, eps, act=act, rms=rms)
    lead = x.shape[:-1]
    return NormForward(y.view(x.shape), None if s is None else s.view(x.shape),
                       None if mean is None else mean.view(lead), rstd.view(lead))


def _launch_forward(x2, r2, s, y, w, b, mean, rstd, eps, *, act, rms) -> None:
    from ._norm_kernels import _norm_fwd_looped_kernel, _norm_fwd_tile_kernel

    m, n = x2.shape
    t = tuning()
    # Unused pointer arguments get x2: Triton needs a tensor there, the kernel never touches it.
    ptrs = [x2, r2 if r2 is not None else x2, s if s is not None else x2, y,
            w if w is not None else x2, b if b is not None else x2,
            mean if mean is not None else rstd, rstd]
    flags = dict(ACT=act, FAST=_fast_gelu(act, x2.dtype), IS_RMS=rms,
                 HAS_RESIDUAL=r2 is not None, HAS_W=w is not None, HAS_B=b is not None,
                 ACC=_tl_acc(x2.dtype))
    cfg = fwd_config(m, n, t) if pow2(n) <= t.fwd_max_block_n else None
    if cfg is not None and cfg.block_n == 0:
        _norm_fwd_tile_kernel[(cdiv(m, cfg.block_m),)](
            *ptrs, m, n, eps, **flags, BLOCK_M=cfg.block_m, BLOCK_N=pow2(n),
            EVEN_N=n == pow2(n), num_warps=cfg.num_warps)
    else:
        block_n = min(cfg.block_n if cfg is not None else t.looped_block_n, pow2(n))
        warps = (cfg.num_warps if cfg is not None else
                 num_warps_for(block_n, t.fwd_elems_per_thread, t))
        _norm_fwd_looped_kernel[(m,)](*ptrs, n, eps, **flags, BLOCK_N=block_n, num_warps=warps)


def norm_backward(dy: torch.Tensor, ds: torch.Tensor | None, xs: torch.Tensor,
                  weight: torch.Tensor | None, bias: torch.Tensor | None,
                  mean: torch.Tensor | None, rstd: torch.Tensor, *, act: int,
                  rms: bool) -> NormBackward:
    """Backward of every norm op. xs is the normalised input (x + residual for add_layer_norm);
    ds, when given, is the gradient reaching that sum directly and is added to dx."""
    if not use_triton(xs):
        return reference_backward(dy, ds, xs, weight, bias, mean, rstd, act=act, rms=rms)
    n = xs.shape[-1]
    x2, dy2, ds2 = _rows(xs, n), _rows(dy, n), _rows(ds, n)
    w, b = _rows(weight, n), _rows(bias, n)
    m = x2.shape[0]
    dx = torch.empty_like(x2)
    if m == 0:  # no rows: zero parameter gradients
        zeros = [None if p is None else p.new_zeros(p.shape) for p in (weight, bias)]
        return NormBackward(dx.view(xs.shape), *zeros)
    mean1 = None if mean is None else mean.reshape(-1)  # (M,)
    dw_part, db_part = _launch_backward(dy2, ds2, x2, w, b, mean1, rstd.reshape(-1), dx,
                                        act=act, rms=rms)
    dw, db = _sum_partials(dw_part, db_part, weight, bias)
    return NormBackward(dx.view(xs.shape), dw, db)


def _sum_partials(dw_part, db_part, weight, bias):
    """(P, N) float32 partials -> (N,) gradients in the parameters' dtypes, one launch."""
    from ._norm_kernels import _sum_partials_kernel

    if dw_part is None and db_part is None:
        return None, None
    part = dw_part if dw_part is not None else db_part
    p, n = part.shape
    t = tuning()
    dw = None if dw_part is None else weight.new_empty(weight.shape)
    db = None if db_part is None else bias.new_empty(bias.shape)
    block_n = min(t.sum_block_n, pow2(n))  # narrow column tiles: many programs share the read
    _sum_partials_kernel[(cdiv(n, block_n),)](
        part if dw_part is None else dw_part, part if db_part is None else db_part,
        dw if dw is not None else db, db if db is not None else dw, p, n,
        HAS_W=dw is not None, HAS_B=db is not None, ACC=_tl_acc(part.dtype),
        BLOCK_P=min(t.sum_block_p, pow2(p)), BLOCK_N=block_n, num_warps=4)
    return dw, db


def _launch_backward(dy2, ds2, x2, w, b, mean, rstd, dx, *, act, rms):
    from ._norm_kernels import _norm_bwd_kernel, _norm_bwd_row_sums_kernel

    m, n = x2.shape
    t = tuning()
    acc = stat_dtype(x2.dtype)
    mean = mean if mean is not None else rstd  # RMSNorm: never read
    flags = dict(ACT=act, FAST=_fast_gelu(act, x2.dtype), IS_RMS=rms, HAS_W=w is not None,
                 HAS_B=b is not None, ACC=_tl_acc(x2.dtype))
    w_ptr = w if w is not None else x2
    b_ptr = b if b is not None else x2
    c1 = c2 = rstd  # unused on the single-block path
    cfg = bwd_config(m, n, t) if pow2(n) <= t.bwd_max_block_n else None
    single = cfg is not None and cfg.block_n == 0
    if single:
        block_m, block_n, col_blocks = cfg.block_m, pow2(n), 1
        warps, per_sm, prefetch, reload_wb = (cfg.num_warps, cfg.programs_per_sm, cfg.prefetch,
                                              cfg.reload_wb)
    else:
        block_m, block_n = 1, min(cfg.block_n if cfg is not None else t.looped_block_n, pow2(n))
        warps = (cfg.num_warps if cfg is not None else
                 num_warps_for(block_n, t.bwd_elems_per_thread, t))
        col_blocks, reload_wb = cdiv(n, block_n), False
        per_sm = cfg.programs_per_sm if cfg is not None else max(1, t.bwd_warps_per_sm // warps)
        prefetch = cfg.prefetch if cfg is not None else 1
        c1 = torch.empty(m, dtype=acc, device=x2.device)
        c2 = torch.empty(m, dtype=acc, device=x2.device)
        _norm_bwd_row_sums_kernel[(m,)](dy2, x2, w_ptr, b_ptr, mean, rstd, c1, c2, n, **flags,
                                        BLOCK_N=block_n, num_warps=warps)
    tiles = cdiv(m, block_m)
    programs = max(1, min(tiles, cdiv(sm_count(x2.device) * per_sm, col_blocks)))
    tiles_per_program = cdiv(tiles, programs)
    programs = cdiv(tiles, tiles_per_program)  # no program without a tile
    dw_part = torch.empty((programs, n), dtype=acc, device=x2.device) if w is not None else None
    db_part = torch.empty((programs, n), dtype=acc, device=x2.device) if b is not None else None
    _norm_bwd_kernel[(programs, col_blocks)](
        dy2, ds2 if ds2 is not None else dy2, x2, w_ptr, b_ptr, mean, rstd, c1, c2, dx,
        dw_part if dw_part is not None else rstd, db_part if db_part is not None else rstd,
        m, n, tiles_per_program, **flags, HAS_DS=ds2 is not None,
        STATS_GIVEN=not single, BLOCK_M=block_m, BLOCK_N=block_n,
        EVEN_N=n % block_n == 0, PREFETCH=prefetch, RELOAD_WB=reload_wb, num_warps=warps)
    return dw_part, db_part


# ---------------------------------------------------------------------------------------------
# module base: the parameters of nn.LayerNorm / nn.RMSNorm, under the same names
# ---------------------------------------------------------------------------------------------
class AffineNorm(torch.nn.Module):
    """weight (ones) and optional bias (zeros) over the last dimension, named as in nn.LayerNorm,
    so a stock LayerNorm / RMSNorm state_dict loads into the fused module unchanged."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float, *,
                 elementwise_affine: bool = True, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                 else tuple(normalized_shape))
        if len(shape) != 1:
            raise ValueError(f"{type(self).__name__} normalises the last dimension only; "
                             f"normalized_shape must be one int, got {normalized_shape!r}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(shape, **factory))
            self.bias = torch.nn.Parameter(torch.empty(shape, **factory)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


def contiguous_or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def empty_if_none(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent weight's gradient travels as a 0-element tensor."""
    return like.new_empty(0) if t is None else t


def fake_param_grad(param: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """What a backward op's fake returns for a parameter's gradient (see empty_if_none)."""
    return like.new_empty(0) if param is None else param.new_empty(param.shape)
