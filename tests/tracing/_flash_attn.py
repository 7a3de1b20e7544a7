"""flash-attn 2.x's custom ops as its package registers them (names, schemas, fake kernels)
and the autograd function its `flash_attn_func` wraps them in, for tests on a machine without
the package (it builds only against CUDA). The kernels themselves raise: tests trace on meta.
Importing this where the real package is installed skips the test (the names would clash)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import Tensor

if importlib.util.find_spec("flash_attn") is not None:
    pytest.skip("flash-attn is installed: its own ops are registered", allow_module_level=True)


@torch.library.custom_op("flash_attn::_flash_attn_forward", mutates_args=(), device_types="cuda")
def _forward(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float, alibi_slopes: Tensor | None,
    return_softmax: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    raise NotImplementedError("emulated: trace on meta")


@_forward.register_fake
def _(q, k, v, *args):
    b, t, h, _ = q.shape
    lse = q.new_empty((b, h, t), dtype=torch.float32)
    return torch.empty_like(q), lse, q.new_empty((0,)), q.new_empty((2,), dtype=torch.int64)


@torch.library.custom_op(
    "flash_attn::_flash_attn_backward", mutates_args=("dq", "dk", "dv"), device_types="cuda"
)
def _backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
    dq: Tensor | None, dk: Tensor | None, dv: Tensor | None, dropout_p: float,
    softmax_scale: float, causal: bool, window_size_left: int, window_size_right: int,
    softcap: float, alibi_slopes: Tensor | None, deterministic: bool,
    rng_state: Tensor | None = None,
) -> Tensor:  # fmt: skip
    raise NotImplementedError("emulated: trace on meta")


@_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, *args, **kwargs):
    return softmax_lse.new_empty(softmax_lse.shape)


class FlashAttnFunc(torch.autograd.Function):
    """q, k, v (B, T, H, D) -> out (B, T, H, D), as flash_attn.flash_attn_func."""

    @staticmethod
    def forward(ctx, q, k, v, dropout_p=0.0, causal=False, window=(-1, -1)):
        scale = q.shape[-1] ** -0.5
        out, lse, _, rng = torch.ops.flash_attn._flash_attn_forward(
            q, k, v, dropout_p, scale, causal, window[0], window[1], 0.0, None, False
        )
        ctx.save_for_backward(q, k, v, out, lse, rng)
        ctx.args = (dropout_p, scale, causal, window)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rng = ctx.saved_tensors
        dropout_p, scale, causal, window = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        torch.ops.flash_attn._flash_attn_backward(
            dout, q, k, v, out, lse, dq, dk, dv, dropout_p, scale, causal, window[0],
            window[1], 0.0, None, False, rng,
        )  # fmt: skip
        return dq, dk, dv, None, None, None
