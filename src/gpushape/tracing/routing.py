"""On the meta device, send SDPA and dropout to the fused kernels a GPU would run.

A meta trace audits a GPU, but PyTorch picks some kernels by device, and on meta it takes the
generic path. This TorchFunctionMode (installed for meta traces only; on a real device the
device chooses) makes the choices CUDA makes for two of them.

Dropout: in training, CUDA runs `F.dropout` (not in place, 0 < p < 1) as one fused kernel,
`aten.native_dropout` (output and a boolean mask; `native_dropout_backward` in backward), where
meta decomposes it into bernoulli_, div_ and mul over a mask as wide as the input.

Convolution layout: on meta, `aten.convolution` always returns a contiguous (NCHW) output; CUDA
returns channels_last when the input or the weight is channels_last (cuDNN's suggested memory
format), and every op after it keeps that layout. `cuda_output_layout` restrides the meta output
the same way (the recorder applies it to every op it sees on meta).

SDPA: PyTorch picks the backend from the device: on CUDA, flash attention or the
memory-efficient kernel when their constraints hold; on the meta device it always falls back to
the math path (Q K^T, softmax, @ V as separate ops, with the T x T score matrix in memory).
The choice CUDA (sm80 and later) makes:

- flash (`aten._scaled_dot_product_flash_attention`): fp16/bf16, 4-D (B, H, T, D) inputs, no
  attention mask, equal head sizes for Q, K, V up to 256, as many K/V heads as Q heads;
- memory-efficient (`aten._scaled_dot_product_efficient_attention`): fp16/bf16/fp32, an
  additive or boolean mask allowed (a boolean mask becomes a -inf/0 bias first, as PyTorch does),
  head sizes a multiple of 16 bytes (8 half, 4 float elements);
- otherwise the math path, traced op by op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_SDPA = torch._C._nn.scaled_dot_product_attention
_DROPOUT = torch.nn.functional.dropout
_HALF = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD_DIM = 256  # FlashAttention-2's largest head size (sdp_utils.cpp)


def _same_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return q.dim() == k.dim() == v.dim() == 4 and q.shape[1] == k.shape[1] == v.shape[1]


def _flash_ok(q, k, v, mask) -> bool:
    d = q.shape[-1]
    return (
        mask is None
        and q.dtype in _HALF
        and k.shape[-1] == d == v.shape[-1]
        and d <= _FLASH_MAX_HEAD_DIM
    )


def _efficient_ok(q, k, v) -> bool:
    if q.dtype not in (*_HALF, torch.float32):
        return False
    align = 8 if q.dtype in _HALF else 4  # 16 bytes of elements
    return q.shape[-1] % align == 0 and k.shape[-1] % align == 0 and v.shape[-1] % align == 0


def _as_bias(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """A boolean mask (True = attend) as an additive bias (0 / -inf), expanded to (B, H, Tq, Tk)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask.logical_not(), float("-inf"), 0.0).to(q.dtype)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return mask.expand(shape)


def route_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The fused kernel's output, or None where CUDA too would take the math path."""
    q, k, v = query, key, value
    if not _same_heads(q, k, v) or (attn_mask is not None and is_causal):
        return None
    if _flash_ok(q, k, v, attn_mask):
        out = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale
        )
        return out[0]  # (B, H, Tq, Dv)
    if _efficient_ok(q, k, v):
        need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, _as_bias(attn_mask, q, k), need_lse, dropout_p, is_causal, scale=scale
        )
        return out[0]
    return None


_CONVOLUTION = torch.ops.aten.convolution.default


def _channels_last(t: torch.Tensor, fmt: torch.memory_format) -> bool:
    return torch._prims_common.suggest_memory_format(t) == fmt


def cuda_output_layout(func: Any, args: tuple, out: Any) -> Any:
    """A meta convolution's output in the memory format CUDA would give it."""
    if func is not _CONVOLUTION or not isinstance(out, torch.Tensor) or out.dim() not in (4, 5):
        return out
    fmt = torch.channels_last if out.dim() == 4 else torch.channels_last_3d
    if _channels_last(args[0], fmt) or _channels_last(args[1], fmt):
        return out.contiguous(memory_format=fmt)
    return out


def route_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor | None:
    """CUDA's fused dropout kernel, or None where CUDA too would not use it."""
    if not training or inplace or not 0.0 < p < 1.0 or input.numel() == 0:
        return None
    return torch.ops.aten.native_dropout(input, p, True)[0]


class GpuKernelRouting(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention and F.dropout as CUDA would, while active."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        route = route_sdpa if func is _SDPA else route_dropout if func is _DROPOUT else None
        if route is not None:
            out = route(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)
