"""FusedQKV: the q, k and v projections of attention as one GEMM, with no copy kernels after it.

    proj = FusedQKV(embed_dim=4096, num_heads=32, num_kv_heads=8, bias=False)
    q, k, v = proj(x)                       # x (B, T, E) -> q (B, H, T, D), k and v (B, Hkv, T, D)
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

One weight of shape ((H + 2 * Hkv) * D, E) holds the three projections stacked (q rows, then k,
then v). The GEMM writes (B, T, (H + 2 * Hkv) * D); q, k and v are strided views of it,
permuted to the (B, heads, T, D) layout scaled_dot_product_attention takes (its kernels need
only the last dim contiguous), so nothing is copied between the GEMM and the attention.

Backward: dq, dk and dv are written into one (B, T, (H + 2 * Hkv) * D) gradient of the GEMM's
output, which the GEMM backward then reads as one matrix: one dX GEMM and one dW GEMM instead of
three each, and no adds of three dX partials. In eager mode a Triton kernel does the writing
(`_qkv_assemble.py`); under torch.compile the views are plain PyTorch and Inductor generates that
copy itself. The layout the gradients come in decides what that kernel is worth. SDPA's backward
gives (B, T, heads, D) memory, which autograd's own `cat` copies as fast; a written-out
attention's matmul gives contiguous (B, heads, T, D), where that `cat` ran at ~1 TB/s on the
H200 and the kernel at ~4 TB/s (benchmarks/kernels/probe_qkv_grads.py).

Checkpoints: state_dict() saves the layout of three separate nn.Linear layers (`q_proj.weight`,
`q_proj.bias`, `k_proj...`, `v_proj...`; the names are configurable), as views of the fused
weight, and load_state_dict() accepts that layout (or the fused `weight` / `bias`), so existing
checkpoints load with strict=True.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._dispatch import eager_path, functorch_active, use_triton
from ._qkv_assemble import assemble_heads, assembly_plan

__all__ = ["FusedQKV"]

DEFAULT_NAMES = ("q_proj", "k_proj", "v_proj")


def _head_dims(embed_dim: int, num_heads: int, num_kv_heads: int | None) -> tuple[int, int]:
    """(head_dim, num_kv_heads), checked."""
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"FusedQKV: {name} must be a positive int, got {value!r}")
    if embed_dim % num_heads:
        raise ValueError(
            f"FusedQKV: num_heads={num_heads} does not divide "
            f"embed_dim={embed_dim}; pick a head count that divides the width"
        )
    kv = num_heads if num_kv_heads is None else num_kv_heads
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or num_heads % kv:
        raise ValueError(
            f"FusedQKV: num_kv_heads={num_kv_heads!r} must be a positive divisor "
            f"of num_heads={num_heads} (grouped-query attention)"
        )
    return embed_dim // num_heads, kv


class FusedQKV(nn.Module):
    """q, k, v = FusedQKV(E, H, Hkv)(x): one GEMM, outputs as (B, heads, T, D) strided views."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        bias: bool = True,
        *,
        names: tuple[str, str, str] = DEFAULT_NAMES,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.head_dim, self.num_kv_heads = _head_dims(embed_dim, num_heads, num_kv_heads)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        if len(names) != 3 or len(set(names)) != 3:
            raise ValueError(
                f"FusedQKV: names must be three distinct sub-module names, got {names!r}"
            )
        self.names = tuple(names)
        rows = (num_heads + 2 * self.num_kv_heads) * self.head_dim
        factory = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(rows, embed_dim, **factory))
        self.bias = nn.Parameter(torch.empty(rows, **factory)) if bias else None
        self.reset_parameters()
        self.register_state_dict_post_hook(_save_as_three_linears)
        self.register_load_state_dict_pre_hook(_load_from_three_linears)

    @property
    def split_sizes(self) -> tuple[int, int, int]:
        """Rows of the fused weight that belong to q, k and v."""
        kv_rows = self.num_kv_heads * self.head_dim
        return (self.num_heads * self.head_dim, kv_rows, kv_rows)

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation of each block (it depends only on fan_in = embed_dim)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.embed_dim)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"FusedQKV: expected x of shape (batch, seq, {self.embed_dim}), "
                f"got {tuple(x.shape)}"
            )
        qkv = F.linear(x, self.weight, self.bias)  # (B, T, (H + 2 Hkv) * D), one GEMM
        sizes = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        if (
            qkv.requires_grad and eager_path(qkv) and use_triton(qkv) and not functorch_active()
        ):  # torch.func: plain ops
            return _SplitHeads.apply(qkv, sizes, self.head_dim)
        return _split_heads(qkv, sizes, self.head_dim)

    @classmethod
    def from_linears(
        cls,
        q_proj: nn.Linear,
        k_proj: nn.Linear,
        v_proj: nn.Linear,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        names: tuple[str, str, str] = DEFAULT_NAMES,
    ) -> FusedQKV:
        """A FusedQKV holding copies of three Linear layers' weights (same dtype and device)."""
        layers = (q_proj, k_proj, v_proj)
        has_bias = {layer.bias is not None for layer in layers}
        if len(has_bias) != 1:
            raise ValueError("FusedQKV.from_linears: q, k and v must all have a bias or none")
        weight = q_proj.weight
        fused = cls(
            q_proj.in_features,
            num_heads,
            num_kv_heads,
            bias=has_bias.pop(),
            names=names,
            device=weight.device,
            dtype=weight.dtype,
        )
        expected = fused.split_sizes
        got = tuple(layer.out_features for layer in layers)
        ins = {layer.in_features for layer in layers}
        if got != expected or len(ins) != 1:
            raise ValueError(
                f"FusedQKV.from_linears: out_features {got} (in_features "
                f"{sorted(ins)}) do not fit {num_heads} heads and "
                f"{fused.num_kv_heads} kv heads of width {fused.embed_dim}: "
                f"expected out_features {expected}"
            )
        with torch.no_grad():
            fused.weight.copy_(torch.cat([layer.weight for layer in layers]))
            if fused.bias is not None:
                fused.bias.copy_(torch.cat([layer.bias for layer in layers]))
        return fused

    def to_linears(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """Three nn.Linear layers with copies of the q, k and v blocks (the reverse swap)."""
        factory = dict(device=self.weight.device, dtype=self.weight.dtype)
        weights = self.weight.detach().split(self.split_sizes)
        biases = (
            self.bias.detach().split(self.split_sizes) if self.bias is not None else (None,) * 3
        )
        layers = []
        for w, b in zip(weights, biases):
            layer = nn.Linear(self.embed_dim, w.shape[0], bias=b is not None, **factory)
            with torch.no_grad():
                layer.weight.copy_(w)
                if b is not None:
                    layer.bias.copy_(b)
            layers.append(layer)
        return tuple(layers)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"bias={self.bias is not None}, names={self.names}"
        )


def _split_heads(
    qkv: torch.Tensor, sizes: tuple[int, int, int], head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, R) -> q, k, v as (B, heads, T, D) strided views: nothing is copied."""
    batch, seq = qkv.shape[0], qkv.shape[1]
    heads = qkv.view(batch, seq, sum(sizes), head_dim)
    q, k, v = heads.split(list(sizes), dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class _SplitHeads(torch.autograd.Function):
    """_split_heads whose backward writes dq, dk, dv into one (B, T, R) gradient with the
    Triton copy of _qkv_assemble.py instead of autograd's cat."""

    @staticmethod
    def forward(ctx, qkv, sizes, head_dim):
        meta = (tuple(qkv.shape), qkv.dtype, qkv.device)
        ctx.sizes, ctx.meta = sizes, meta
        # built here, on the calling thread: the backward runs on autograd's device thread,
        # where the same Python costs about twice as much (benchmarks/kernels/host_costs.py)
        ctx.plan = assembly_plan(meta[0], sizes, meta[1], meta[2]) if qkv.numel() else None
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (zeros)
        return _split_heads(qkv, sizes, head_dim)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        return assemble_heads((dq, dk, dv), ctx.sizes, *ctx.meta, ctx.plan), None, None


def _save_as_three_linears(module: FusedQKV, state_dict, prefix: str, local_metadata) -> None:
    """weight / bias -> <q>.weight, <q>.bias, <k>.weight, ... (views of the fused tensors)."""
    params = [
        (suffix, state_dict.pop(prefix + suffix))
        for suffix in ("weight", "bias")
        if prefix + suffix in state_dict
    ]
    parts = {suffix: t.split(module.split_sizes) for suffix, t in params}
    for i, name in enumerate(module.names):
        for suffix, _ in params:
            state_dict[f"{prefix}{name}.{suffix}"] = parts[suffix][i]


def _load_from_three_linears(
    module: FusedQKV,
    state_dict,
    prefix: str,
    local_metadata,
    strict,
    missing_keys,
    unexpected_keys,
    error_msgs,
) -> None:
    """<q>.weight, <k>.weight, <v>.weight (and biases) -> the fused weight (and bias)."""
    for suffix in ("weight", "bias"):
        keys = [f"{prefix}{name}.{suffix}" for name in module.names]
        present = [k for k in keys if k in state_dict]
        if not present:
            continue  # the fused layout, or nothing: load_state_dict reports what is missing
        if len(present) != 3:
            error_msgs.append(f"FusedQKV at '{prefix}': found {present} but not all of {keys}")
            continue
        parts = [state_dict[k] for k in keys]
        expected = [
            (rows, module.embed_dim) if suffix == "weight" else (rows,)
            for rows in module.split_sizes
        ]
        got = [tuple(p.shape) for p in parts]
        if got != expected:
            error_msgs.append(
                f"FusedQKV at '{prefix}': {suffix} shapes {got} do not match the "
                f"q, k, v shapes {expected}"
            )
            continue
        for k in keys:
            del state_dict[k]
        state_dict[prefix + suffix] = torch.cat(parts)
