"""Helpers shared by the softmax_dropout tests (CPU lane and GPU lane): the PyTorch composition
the kernel is gated against, the mask the op draws after `torch.manual_seed(SEED)`, and the
dropout statistics check."""

import math

import torch
import torch.nn.functional as F

from gpushape.kernels.attention.softmax_dropout import draw_seed, dropout_keep_mask, softmax_dropout

from ._numeric import gate_forward_backward

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SEED = 1234
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def seeded(fn):
    """fn run right after torch.manual_seed(SEED), so the op draws a known seed."""

    def run(*args, **kwargs):
        torch.manual_seed(SEED)
        return fn(*args, **kwargs)

    return run


def keep_scale(shape, p):
    """float64 keep / (1 - p) for the seed the op draws after manual_seed(SEED)."""
    torch.manual_seed(SEED)
    seed = draw_seed(DEV)
    return dropout_keep_mask(seed, shape, p, DEV).double() / (1 - p)


def logits(x, scale=1.0, attn_mask=None, is_causal=False):
    z = x * scale
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        z = z.masked_fill(~attn_mask, -math.inf)
    elif attn_mask is not None:
        z = z + attn_mask.to(z.dtype)
    if is_causal:
        allowed = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril()
        z = z.masked_fill(~allowed, -math.inf)
    return z


def torch_composition(shape, p, **kw):
    """PyTorch's softmax, then dropout's masked scale in the accumulate dtype, at x's dtype."""
    keep = keep_scale(shape, p) if p > 0 else None

    def fn(x, mask=None):
        opts = dict(kw, attn_mask=mask) if mask is not None else kw
        s = F.softmax(logits(x, **opts), dim=-1)
        if keep is None:
            return s
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        return (s.to(acc) * keep.to(acc)).to(x.dtype)

    return fn


def gate(x, p, mask=None, **kw):
    """Numeric gate of output and gradients (x, and the mask when it requires grad)."""

    def ours(x, mask=None):
        opts = dict(kw, attn_mask=mask) if mask is not None else kw
        return softmax_dropout(x, p, **opts)

    inputs = (x,) if mask is None else (x, mask)
    gate_forward_backward(
        seeded(ours),
        torch_composition(tuple(x.shape), p, **kw),
        inputs,
        names=("x", "mask")[: len(inputs)],
    )


def randn(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, device=DEV, dtype=dtype).requires_grad_(grad)


def keep_fraction_ok(keep: torch.Tensor, p: float, sigmas: float = 5.0) -> None:
    """Kept fraction within `sigmas` standard errors of 1 - p, overall, per column lane of a
    Philox call (col % 8) and for pairs of neighbours (independence)."""
    n = keep.numel()
    q = 1 - p
    assert abs(keep.double().mean().item() - q) <= sigmas * math.sqrt(p * q / n) + 1e-12
    lanes = keep.reshape(-1, keep.shape[-1])[:, : keep.shape[-1] // 8 * 8].reshape(-1, 8)
    lane_n = lanes.shape[0]
    lane_err = (lanes.double().mean(0) - q).abs().max().item()
    assert lane_err <= sigmas * math.sqrt(p * q / lane_n) + 1e-12
    pairs = (lanes[:, 0::2] & lanes[:, 1::2]).double()
    pair_err = abs(pairs.mean().item() - q * q)
    assert pair_err <= sigmas * math.sqrt(q * q * (1 - q * q) / pairs.numel()) + 1e-12
