"""softmax_dropout: dropout(softmax(scale * x + mask)) over the last dim, in one Triton kernel.

    y = softmax_dropout(x, p=0.1, scale=head_dim ** -0.5, attn_mask=mask, is_causal=True)

- Masks: `attn_mask` broadcasts to x; bool means "attend" (True takes part, as in
  scaled_dot_product_attention), a float mask is added to the scaled logits. `is_causal` keeps
  key j <= query i over the last two dims (top-left aligned, as in SDPA). Both may be given.
- Dropout: the mask is never stored. The forward draws one int64 seed from torch's generator on
  x's device (`torch.randint`, no host sync, CUDA-graph safe), so torch.manual_seed makes a
  call reproducible bit for bit and every call advances the RNG like torch's dropout does; the
  backward regenerates the same Philox mask from the seed (see _attn_philox). The drop
  probability is p rounded to a multiple of 1/65536; kept values are scaled by 1 / (1 - p).
- Memory: autograd keeps the input x, the seed and two float32 numbers per row (row max and
  row sum); the backward recomputes the softmax from them. The softmax output and the mask are
  not kept. (In a network where x would otherwise be freed, keeping x costs what keeping the
  softmax output would.)
- A row whose entries are all -inf (after masking) gives zeros, not NaN, and zero gradient.
  NaN in a row makes the row NaN, as in PyTorch. p = 0 and training=False run the same kernel
  without dropout.
- fp32, fp16, bf16 (and fp64); arithmetic in fp32 (fp64 for fp64). CUDA tensors run the Triton
  kernels; CPU tensors run the PyTorch reference, or the kernels under TRITON_INTERPRET=1.
"""

import math
from contextlib import nullcontext

import numpy as np
import torch
import triton
from torch import nn

from .._dispatch import (
    FLOAT_DTYPES,
    check_float,
    check_same_device,
    functorch_active,
    use_triton,
)
from . import _softmax_bwd_kernels as KB
from . import _softmax_kernels as K
from ._philox import check_p as _check_p
from ._philox import draw_seed, drop_threshold, dropout_keep_mask
from ._softmax_reference import backward_reference, compute_dtype, forward_reference

__all__ = [
    "SINGLE_PASS_MAX_N",
    "SoftmaxDropout",
    "draw_seed",
    "dropout_keep_mask",
    "softmax_dropout",
]

# Rows up to this length run in one pass with the row in registers; longer rows take the
# two-pass (online max/sum) kernels, which read the row twice.
SINGLE_PASS_MAX_N = 16384
_TILE_ELEMS = 4096  # elements per program in the one-pass kernels
_LOOP_CHUNK = 4096  # columns per step in the two-pass kernels


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _strided_view(t: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, tuple, bool]:
    """(tensor, (s0, s1, s2, sn), flat) locating t broadcast to `shape` as rows of a 4-D view
    (D0, D1, D2, N). flat: the rows sit at one constant stride s2 (a 2-D (R, N) view), so the
    kernel needs no division to find a row. Copies only a >4-D tensor whose strides do not merge.
    """
    t = t.expand(shape)
    if t.dim() >= 2:
        try:
            flat = t.view(-1, shape[-1])
            return flat, (0, 0, flat.stride(0), flat.stride(1)), True
        except RuntimeError:
            pass  # strides that do not merge into one row stride: locate rows in 4-D
    if t.dim() <= 4:
        t4 = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    else:
        t4 = t.reshape(-1, *t.shape[-3:])
    return t4, t4.stride(), False


def _dims(shape: torch.Size) -> tuple[int, int, int, int]:
    """(R, D1, D2, N) of the 4-D row view of `shape`."""
    dims = (1,) * max(0, 4 - len(shape)) + tuple(shape)
    d1, d2, n = dims[-3], dims[-2], dims[-1]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    if rows >= 2**31:
        raise ValueError(
            f"softmax_dropout: {rows} rows exceed the kernels' 2^31 - 1 limit; split the batch"
        )
    return rows, d1, d2, n


def _hi_lo(value: float) -> tuple[float, float]:
    """value as fp32 hi + fp32 lo (Triton passes Python floats as fp32; see _wide)."""
    hi = float(np.float32(value))
    return hi, (float(value) - hi if math.isfinite(hi) else 0.0)


def _tiling(n: int, rows: int) -> tuple[bool, int, int, int]:
    """(looped, BLOCK_M, BLOCK_G, num_warps) for rows of n columns."""
    block_n = max(8, _next_pow2(n))
    if block_n > SINGLE_PASS_MAX_N:
        return True, 1, _LOOP_CHUNK // 8, 8
    block_m = max(1, min(_TILE_ELEMS // block_n, _next_pow2(rows)))
    num_warps = min(16, max(1, block_m * block_n // 512))
    return False, block_m, block_n // 8, num_warps


def _common_args(x, seed, p, scale, mask, is_causal):
    """Pointer/stride/size arguments shared by the forward and backward launches."""
    xt, x_strides, x_flat = _strided_view(x, x.shape)
    if mask is None:
        mt, m_strides, m_flat, mode = xt, (0, 0, 0, 0), True, 0
    else:
        mt, m_strides, m_flat = _strided_view(mask, x.shape)
        mode = 1 if mask.dtype == torch.bool else 2
    has_dropout = p > 0
    ptrs = (xt, *x_strides, mt, *m_strides)
    sizes = (
        *_dims(x.shape),
        *_hi_lo(scale),
        drop_threshold(p) if has_dropout else 0,
        *_hi_lo(1.0 / (1.0 - p)),
    )
    flags = dict(
        MASK_MODE=mode,
        IS_CAUSAL=bool(is_causal),
        HAS_DROPOUT=has_dropout,
        PRECISE=x.dtype == torch.float32,
        F64=x.dtype == torch.float64,
        X_FLAT=x_flat,
        M_FLAT=m_flat,
    )
    return ptrs, sizes, flags, seed if has_dropout else xt


def _launch(kernel_single, kernel_looped, lead, tail, ptrs, sizes, flags, rows, n, device):
    looped, block_m, block_g, num_warps = _tiling(n, rows)
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
        if looped:
            kernel_looped[(rows,)](
                *lead, *ptrs, *tail, *sizes, **flags, BLOCK_G=block_g, num_warps=num_warps
            )
        else:
            grid = (triton.cdiv(rows, block_m),)
            no_pad = n == block_g * 8 and rows % block_m == 0
            kernel_single[grid](
                *lead,
                *ptrs,
                *tail,
                *sizes,
                **flags,
                NO_PAD=no_pad,
                BLOCK_M=block_m,
                BLOCK_G=block_g,
                num_warps=num_warps,
            )


def forward_triton(x, seed, p, scale, mask, is_causal):
    ptrs, sizes, flags, seed_arg = _common_args(x, seed, p, scale, mask, is_causal)
    rows, n = sizes[0], sizes[3]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    stats = torch.empty((2, rows), dtype=compute_dtype(x.dtype), device=x.device)
    if rows > 0:
        _launch(
            K.softmax_dropout_fwd_kernel,
            K.softmax_dropout_fwd_looped_kernel,
            (),
            (y, stats, seed_arg),
            ptrs,
            sizes,
            flags,
            rows,
            n,
            x.device,
        )
    return y, stats


def backward_triton(dy, x, stats, seed, p, scale, mask, is_causal, grad_scale):
    ptrs, sizes, flags, seed_arg = _common_args(x, seed, p, scale, mask, is_causal)
    rows, n = sizes[0], sizes[3]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows > 0:
        dyt, dy_strides, dy_flat = _strided_view(dy, x.shape)
        _launch(
            KB.softmax_dropout_bwd_kernel,
            KB.softmax_dropout_bwd_looped_kernel,
            (dyt, *dy_strides),
            (dx, stats, seed_arg),
            ptrs,
            (*sizes, *_hi_lo(grad_scale)),
            dict(flags, DY_FLAT=dy_flat),
            rows,
            n,
            x.device,
        )
    return dx


# ---------------------------------------------------------------------------------------------
# Custom ops (fake impl + autograd, so torch.compile(fullgraph=True) and CUDA graphs work)
# ---------------------------------------------------------------------------------------------


@torch.library.custom_op(
    "gpushape::softmax_dropout_fwd",
    mutates_args=(),
    schema="(Tensor x, Tensor? seed, float p, float scale, Tensor? mask, bool is_causal)"
    " -> (Tensor, Tensor)",
)
def softmax_dropout_fwd(x, seed, p, scale, mask, is_causal):
    """(y, stats) with stats (2, rows): row max and row sum of exp(z - max)."""
    if use_triton(x):
        return forward_triton(x, seed, p, scale, mask, is_causal)
    return forward_reference(x, seed, p, scale, mask, is_causal)


@softmax_dropout_fwd.register_fake
def _(x, seed, p, scale, mask, is_causal):
    rows = x.numel() // x.shape[-1]
    return x.new_empty(x.shape), x.new_empty((2, rows), dtype=compute_dtype(x.dtype))


@torch.library.custom_op(
    "gpushape::softmax_dropout_bwd",
    mutates_args=(),
    schema="(Tensor dy, Tensor x, Tensor stats, Tensor? seed, float p, float scale,"
    " Tensor? mask, bool is_causal, float grad_scale) -> Tensor",
)
def softmax_dropout_bwd(dy, x, stats, seed, p, scale, mask, is_causal, grad_scale):
    """grad_scale * dL/dz for z = scale * x + mask, from x, the stats and the seed."""
    if use_triton(x):
        return backward_triton(dy, x, stats, seed, p, scale, mask, is_causal, grad_scale)
    return backward_reference(dy, x, stats, seed, p, scale, mask, is_causal, grad_scale)


@softmax_dropout_bwd.register_fake
def _(dy, x, stats, seed, p, scale, mask, is_causal, grad_scale):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    x, seed, p, scale, mask, is_causal = inputs
    ctx.save_for_backward(x, seed, mask, output[1])
    ctx.p, ctx.scale, ctx.is_causal = p, scale, is_causal
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zero-filled (2, rows) gradient for the stats


def _backward(ctx, dy, _dstats):
    if dy is None:
        return None, None, None, None, None, None
    x, seed, mask, stats = ctx.saved_tensors
    need_x, need_mask = ctx.needs_input_grad[0], ctx.needs_input_grad[4]
    args = (x, stats, seed, ctx.p, ctx.scale, mask, ctx.is_causal)
    if not need_mask:
        return softmax_dropout_bwd(dy, *args, ctx.scale), None, None, None, None, None
    dz = softmax_dropout_bwd(dy, *args, 1.0)  # an additive mask's gradient is dL/dz, summed
    dx = dz * ctx.scale if need_x else None
    return dx, None, None, None, dz.sum_to_size(mask.shape).to(mask.dtype), None


softmax_dropout_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _check_inputs(x, p, scale, attn_mask, is_causal) -> None:
    op = "softmax_dropout"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a tensor, got {type(x).__name__}")
    check_float(op, x=x)
    _check_p(op, p)
    if isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float)):
        raise TypeError(f"{op}: scale must be a Python number, got {type(scale).__name__}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"{op}: x needs a last dim of size >= 1 to take the softmax over, "
            f"got shape {tuple(x.shape)}"
        )
    if is_causal and x.dim() < 2:
        raise ValueError(
            f"{op}: is_causal needs x of at least 2 dims (..., queries, keys), "
            f"got shape {tuple(x.shape)}"
        )
    if attn_mask is None:
        return
    check_same_device(op, x=x, attn_mask=attn_mask)
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{op}: attn_mask must be bool (True = attend) or a float additive "
            f"mask, got {attn_mask.dtype}"
        )
    try:
        fits = torch.broadcast_shapes(attn_mask.shape, x.shape) == x.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"{op}: attn_mask of shape {tuple(attn_mask.shape)} does not "
            f"broadcast to x's shape {tuple(x.shape)}"
        )


def softmax_dropout(
    x: torch.Tensor,
    p: float,
    training: bool = True,
    scale: float = 1.0,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """dropout(softmax(scale * x + attn_mask, dim=-1), p) in one kernel (see module doc)."""
    _check_inputs(x, p, scale, attn_mask, is_causal)
    drop = bool(training) and p > 0
    seed = draw_seed(x.device) if drop else None
    if functorch_active():  # torch.func: the plain-PyTorch reference, same Philox mask
        return forward_reference(
            x, seed, float(p) if drop else 0.0, float(scale), attn_mask, bool(is_causal)
        )[0]
    y, _ = softmax_dropout_fwd(
        x, seed, float(p) if drop else 0.0, float(scale), attn_mask, bool(is_causal)
    )
    return y


class SoftmaxDropout(nn.Module):
    """Module form of softmax_dropout; drops only in training mode."""

    def __init__(self, p: float = 0.1, scale: float = 1.0) -> None:
        super().__init__()
        _check_p("SoftmaxDropout", p)
        self.p = float(p)
        self.scale = float(scale)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        return softmax_dropout(x, self.p, self.training, self.scale, attn_mask, is_causal)

    def extra_repr(self) -> str:
        return f"p={self.p}, scale={self.scale}"
