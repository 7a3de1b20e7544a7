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
the same way (the recorder applies it to every op it sees on meta), and GroupNorm's input
gradient, which CUDA always writes contiguous. `aten.convolution_backward` writes both
gradients in that same format, of the input and the weight: torch 2.11's meta kernel took the
input gradient's from the incoming gradient instead, which a global average pool's backward
hands over contiguous, so every channels_last convnet's backward was traced NCHW from its head
down (EfficientNet-B0 compiled on an H100: 16.4 ms of GPU work priced, 11.5 measured, 12.4
with CUDA's rule; benchmarks/results/loops-h100-35).

SDPA: PyTorch picks the backend from the device: on CUDA, flash attention or the
memory-efficient kernel when their constraints hold; on the meta device it always falls back to
the math path (Q K^T, softmax, @ V as separate ops, with the T x T score matrix in memory, in
fp32 for half inputs). `sdpa_backend` holds the rules of torch's CUDA dispatcher
(`select_sdp_backend` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, torch 2.5 to
2.13, sm80 to sm90), tried in its order, each only while `torch.backends.cuda` (or an
`sdpa_kernel` block) leaves the backend enabled:

- both fused kernels: 4-D (B, H, T, D) dense inputs of one batch size and dtype, nonzero
  sequence lengths, head dimension of unit stride; an explicit mask together with is_causal is
  an error on every path (left to the math path to raise);
- flash (`aten._scaled_dot_product_flash_attention`): fp16/bf16, no attention mask, equal head
  sizes for Q, K, V up to 256 (a size that is not a multiple of 8 is zero-padded to one around
  the kernel, as CUDA's SDPA does), is_causal only with as many queries as keys, as many K/V
  heads as Q heads or, with `enable_gqa=True`, a number of K (= V) heads dividing Q's
  (grouped-query attention); dropout and an explicit scale allowed;
- memory-efficient (`aten._scaled_dot_product_efficient_attention`): fp16/bf16/fp32, a boolean
  or additive mask of unit stride in its last dimension allowed (as PyTorch does, a boolean
  mask becomes a -inf/0 bias first, and a bias whose strides are not multiples of 8 is copied
  into a padded one), equal Q and K head sizes, Q/K and V head sizes a multiple of 16 bytes
  (8 half, 4 float elements), equal head counts (no grouped-query attention: with `enable_gqa`
  and fewer K/V heads, CUDA takes the math path); causal with unequal lengths, dropout and
  scale allowed;
- otherwise the math path, traced op by op.

Not modelled: cuDNN attention, which recent torch tries first on sm90/sm100 with a cuDNN newer
than 9.15 (a fused kernel too, with no score matrix in memory: such calls are traced as the
flash or memory-efficient kernel torch would run without it), the sm86/sm89 limits on flash's
backward for head sizes above 192, and nested (jagged) tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_SDPA = torch._C._nn.scaled_dot_product_attention
_DROPOUT = torch.nn.functional.dropout
_HALF = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD_DIM = 256  # FlashAttention-2's largest head size (sdp_utils.cpp)
_FLASH_HEAD_ALIGN = 8  # CUDA's SDPA pads flash's head size to a multiple of 8
_BIAS_ALIGN = 8  # the memory-efficient kernel's bias: strides and last dim in 8s, else padded


def sdpa_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> str:
    """ "flash", "efficient" or "math": the kernel CUDA's SDPA runs for these arguments (the
    rules in the module docstring, in torch's order); `dropout_p` and `scale` never decide."""
    q, k, v = query, key, value
    if not _fused_possible(q, k, v, attn_mask, is_causal):
        return "math"
    cuda = torch.backends.cuda
    if cuda.flash_sdp_enabled() and _flash_ok(q, k, v, attn_mask, is_causal, enable_gqa):
        return "flash"
    if cuda.mem_efficient_sdp_enabled() and _efficient_ok(q, k, v, attn_mask):
        return "efficient"
    return "math"


def _fused_possible(q, k, v, mask, is_causal: bool) -> bool:
    """What both fused kernels need: dense 4-D inputs of one batch size and dtype, nonzero
    sequence lengths, and arguments the math path would not reject (mask with is_causal)."""
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and not t.is_nested for t in tensors):
        return False
    if not all(t.dim() == 4 for t in tensors) or (mask is not None and is_causal):
        return False
    same_batch = q.shape[0] == k.shape[0] == v.shape[0]
    same_dtype = q.dtype == k.dtype == v.dtype
    return same_batch and same_dtype and q.shape[-2] > 0 and k.shape[-2] > 0


def _heads_ok(q, k, v, gqa: bool) -> bool:
    """As many K/V heads as Q heads or, for grouped-query attention, K = V heads dividing Q's."""
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if hq == hk == hv:
        return True
    return gqa and hk == hv and hk > 0 and hq % hk == 0


def _unit_stride(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.stride(-1) == 1 for t in tensors)


def _flash_ok(q, k, v, mask, is_causal: bool, enable_gqa: bool) -> bool:
    d = q.shape[-1]
    return (
        mask is None
        and q.dtype in _HALF
        and k.shape[-1] == d == v.shape[-1]
        and d <= _FLASH_MAX_HEAD_DIM
        and (not is_causal or q.shape[-2] == k.shape[-2])  # top-left causal, square only
        and _heads_ok(q, k, v, enable_gqa)
        and (d == 1 or _unit_stride(q, k, v))
    )


def _efficient_ok(q, k, v, mask) -> bool:
    if q.dtype not in (*_HALF, torch.float32):
        return False
    align = 8 if q.dtype in _HALF else 4  # 16 bytes of elements
    d, dv = q.shape[-1], v.shape[-1]
    return (
        k.shape[-1] == d
        and d % align == 0
        and dv % align == 0
        and _heads_ok(q, k, v, gqa=False)  # no grouped-query support
        and _unit_stride(q, k, v, mask)
    )


def _flash(q, k, v, dropout_p: float, is_causal: bool, scale: float | None) -> torch.Tensor:
    """CUDA's flash call: a head size off 8 zero-padded to one and the output sliced back, at
    the scale of the unpadded size."""
    d = q.shape[-1]
    pad = -d % _FLASH_HEAD_ALIGN
    if pad:
        scale = d**-0.5 if scale is None else scale
        q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, dropout_p, is_causal, False, scale=scale
    )[0]  # (B, H, Tq, Dv)
    return out[..., :d] if pad else out


def _as_bias(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The mask as CUDA hands it to the memory-efficient kernel: a boolean one (True = attend)
    as an additive bias (0 / -inf), padded to 8 in its last dimension where its strides are
    not multiples of 8, expanded to (B, H, Tq, Tk)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        zero = torch.scalar_tensor(0.0, dtype=q.dtype, device=mask.device)
        mask = torch.where(mask.logical_not(), float("-inf"), zero)
    strides = mask.stride()
    if mask.dim() and (any(s % _BIAS_ALIGN for s in strides[:-1]) or strides[-1] != 1):
        size = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, _BIAS_ALIGN - size % _BIAS_ALIGN))[..., :size]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


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
    backend = sdpa_backend(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if backend == "flash":
        return _flash(q, k, v, dropout_p, is_causal, scale)
    if backend == "efficient":
        need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, _as_bias(attn_mask, q, k), need_lse, dropout_p, is_causal, scale=scale
        )
        return out[0]
    return None


_CONVOLUTION = torch.ops.aten.convolution.default
_CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward.default


def _channels_last(t: torch.Tensor, fmt: torch.memory_format) -> bool:
    return torch._prims_common.suggest_memory_format(t) == fmt


_GROUP_NORM_BACKWARD = torch.ops.aten.native_group_norm_backward.default


def cuda_output_layout(func: Any, args: tuple, out: Any) -> Any:
    """A meta convolution's output, and its backward's gradients, in the memory format CUDA
    would give them; GroupNorm's input gradient contiguous, as CUDA's kernel writes it whatever
    its inputs' layout (a meta decomposition may keep a channels_last gradient's strides:
    torch 2.14)."""
    if func is _GROUP_NORM_BACKWARD and isinstance(out, tuple) and out:
        dx = out[0]
        if isinstance(dx, torch.Tensor) and not dx.is_contiguous():
            return (dx.contiguous(), *out[1:])
        return out
    if func is _CONVOLUTION_BACKWARD and isinstance(out, tuple) and len(args) > 2:
        return tuple(_conv_layout(g, args[1], args[2]) for g in out)
    if func is not _CONVOLUTION:
        return out
    return _conv_layout(out, args[0], args[1])


def _conv_layout(out: Any, input: torch.Tensor, weight: torch.Tensor) -> Any:
    """`out` (a convolution's output or one of its gradients) in cuDNN's suggested memory
    format of `input` and `weight`: channels_last where either of them is, else contiguous."""
    if not isinstance(out, torch.Tensor) or out.dim() not in (4, 5):
        return out
    fmt = torch.channels_last if out.dim() == 4 else torch.channels_last_3d
    if not (_channels_last(input, fmt) or _channels_last(weight, fmt)):
        fmt = torch.contiguous_format
    return out if out.is_contiguous(memory_format=fmt) else out.contiguous(memory_format=fmt)


def route_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor | None:
    """CUDA's fused dropout kernel, or None where CUDA too would not use it."""
    if not training or inplace or not 0.0 < p < 1.0 or input.numel() == 0:
        return None
    return torch.ops.aten.native_dropout(input, p, True)[0]


# Depth of SDPA calls on half inputs that CUDA too runs on its math path, which computes them
# in fp32 whatever the model's dtype: the recorder tags their ops "sdpa_math".
_HALF_MATH_SDPA = [0]


def in_half_math_sdpa() -> bool:
    """Whether the op being recorded belongs to an SDPA call on half inputs that CUDA runs
    on its math path (upcast to fp32 there, not by the model's choice of dtype)."""
    return _HALF_MATH_SDPA[0] > 0


_CONTAINS = torch.Tensor.__contains__


class GpuKernelRouting(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention and F.dropout as CUDA would, while active (a
    trace on the meta device). Also answers `value in tensor` for a meta tensor, a test of
    values it does not have, with False: the libraries use it for checks that change nothing
    the GPU runs (transformers warns when input ids look padded: DeBERTa-v2)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is _CONTAINS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return False
        route = route_sdpa if func is _SDPA else route_dropout if func is _DROPOUT else None
        if route is not None:
            out = route(*args, **kwargs)
            if out is not None:
                return out
        query = args[0] if args else kwargs.get("query")
        if func is _SDPA and isinstance(query, torch.Tensor) and query.dtype in _HALF:
            _HALF_MATH_SDPA[0] += 1
            try:
                return func(*args, **kwargs)
            finally:
                _HALF_MATH_SDPA[0] -= 1
        return func(*args, **kwargs)
