"""Plain-PyTorch softmax_dropout: the CPU path and the tests' definition of the op.

It follows the kernels step for step (same masking rules, same per-row statistics, the same
Philox mask from `keep_mask_reference`), so a CPU run and a GPU run with one seed drop the same
elements. Arithmetic is float32 (float64 for float64 input) like the kernels.
"""

from __future__ import annotations

import torch

from ._philox import keep_mask_reference


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def causal_keep(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """(rows, cols) bool: query i attends to keys j <= i (top-left aligned, as in SDPA)."""
    return torch.ones(rows, cols, dtype=torch.bool, device=device).tril()


def logits_reference(
    x: torch.Tensor, scale: float, mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor:
    """z = scale * x (+ additive mask); -inf where a bool mask is False or above the diagonal."""
    z = x.to(compute_dtype(x.dtype)) * scale
    if mask is not None and mask.dtype == torch.bool:
        z = z.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        z = z + mask.to(z.dtype)
    if is_causal:
        z = z.masked_fill(~causal_keep(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    return z


def keep_scale_reference(seed: torch.Tensor | None, x: torch.Tensor, p: float) -> torch.Tensor:
    """1 / (1 - p) where kept, 0 where dropped, in x's shape and compute dtype."""
    n = x.shape[-1]
    keep = keep_mask_reference(int(seed.item()), x.numel() // n, n, p, x.device)
    return keep.reshape(x.shape).to(compute_dtype(x.dtype)) / (1.0 - p)


def _probs(z: torch.Tensor, row_max: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
    e = torch.exp(z - row_max)
    return e / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)


def forward_reference(
    x: torch.Tensor,
    seed: torch.Tensor | None,
    p: float,
    scale: float,
    mask: torch.Tensor | None,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, stats): y in x's dtype and shape; stats (2, rows) = row max (0 if fully masked), sum."""
    z = logits_reference(x, scale, mask, is_causal)
    row_max = z.amax(dim=-1, keepdim=True)
    row_max = torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)
    row_sum = torch.exp(z - row_max).sum(dim=-1, keepdim=True)
    y = _probs(z, row_max, row_sum)
    if p > 0:
        y = y * keep_scale_reference(seed, x, p)
    stats = torch.stack([row_max.reshape(-1), row_sum.reshape(-1)])
    return y.to(x.dtype).contiguous(), stats


def backward_reference(
    dy: torch.Tensor,
    x: torch.Tensor,
    stats: torch.Tensor,
    seed: torch.Tensor | None,
    p: float,
    scale: float,
    mask: torch.Tensor | None,
    is_causal: bool,
    grad_scale: float,
) -> torch.Tensor:
    """dx = grad_scale * s * (g - sum(s * g)), g = dy * keep / (1 - p), s recomputed from x."""
    z = logits_reference(x, scale, mask, is_causal)
    row_shape = (*x.shape[:-1], 1)
    s = _probs(z, stats[0].reshape(row_shape), stats[1].reshape(row_shape))
    g = dy.to(s.dtype)
    if p > 0:
        g = g * keep_scale_reference(seed, x, p)
    dz = s * (g - (s * g).sum(dim=-1, keepdim=True))
    return (dz * grad_scale).to(x.dtype).contiguous()
