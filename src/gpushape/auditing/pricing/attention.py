"""Attention as the cost model would price it: the fused kernel, or the math path written out.

Shapes: Q (BH, Tq, D), K (BH, Tk, D), V (BH, Tk, Dv), BH = batch x heads. Fused records use the
trace's own attention ops (flash for fp16/bf16 without a mask and D <= 256, else the
memory-efficient kernel), so their FLOPs, bytes and efficiency come from trace/flops_attention.py
and tracing/gemm_model.py like any traced op. The rules (manual-attention, attention-head-dim)
compare what the model runs with these.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ...tracing.records import OpRecord
from .synth import record, tensor

HALF = ("float16", "bfloat16")
FLASH_MAX_HEAD_DIM = 256  # as trace/sdpa.py routes (FlashAttention-2's largest head size)


@dataclass(frozen=True)
class AttentionShape:
    bh: int
    tq: int
    tk: int
    d: int
    dv: int
    dtype: str  # "bfloat16"
    has_mask: bool = False
    dropout: bool = False
    # the mask varies over query positions too (a (T, T) mask, as a causal one does; a
    # key-padding mask of shape (B, 1, 1, T) does not)
    mask_per_query: bool = False

    def score_bytes(self) -> int:
        return self.bh * self.tq * self.tk * tensor((1,), self.dtype).itemsize


def traced_shape(rec: OpRecord, has_mask: bool = False) -> AttentionShape:
    """The shape of a traced SDPA call (its query, key and value inputs), with or without a
    mask; heads are the query's."""
    q, k, v = rec.input("query"), rec.input("key"), rec.input("value")
    return AttentionShape(
        bh=math.prod(q.shape[:-2]),
        tq=q.shape[-2],
        tk=k.shape[-2],
        d=q.shape[-1],
        dv=v.shape[-1],
        dtype=q.dtype,
        has_mask=has_mask,
        dropout=float(rec.params.get("dropout_p", 0.0) or 0.0) > 0,
    )


def fused_backend(s: AttentionShape) -> str | None:
    """The fused kernel SDPA takes for these shapes on CUDA (mirrors trace/sdpa.py), or None."""
    if s.dtype in HALF and not s.has_mask and s.d == s.dv and s.d <= FLASH_MAX_HEAD_DIM:
        return "flash"
    if s.dtype not in (*HALF, "float32"):
        return None
    align = 8 if s.dtype in HALF else 4  # 16 bytes of elements
    if s.d % align == 0 and s.dv % align == 0:
        return "efficient"
    return None


def fused_records(
    s: AttentionShape, train: bool, backend: str = "flash", causal: bool = False
) -> list[OpRecord]:
    q = tensor((s.bh, 1, s.tq, s.d), s.dtype)
    k = tensor((s.bh, 1, s.tk, s.d), s.dtype)
    v = tensor((s.bh, 1, s.tk, s.dv), s.dtype)
    out = tensor((s.bh, 1, s.tq, s.dv), s.dtype)
    lse = tensor((s.bh, 1, s.tq), "float32")
    name = f"aten._scaled_dot_product_{backend}_attention"  # flash, efficient, cudnn
    params = {"dropout_p": 0.1 if s.dropout else 0.0, "is_causal": causal}
    qkv = {"query": q, "key": k, "value": v}
    if backend == "cudnn" and s.has_mask:  # cuDNN's kernel given the mask (a boolean one)
        qkv["attn_bias"] = tensor((s.bh, 1, s.tq, s.tk), "bool")
    recs = [record(f"{name}.default", qkv, [out, lse], params=params)]
    if train:
        recs.append(
            record(
                f"{name}_backward.default",
                {"grad_out": out, **qkv, "out": out, "logsumexp": lse},
                [q, k, v],
                params=params,
                phase="backward",
            )
        )
    return recs


def math_path_shape(s: AttentionShape) -> AttentionShape:
    """The shape as PyTorch's math path computes it: half inputs in float32 (PyTorch >= 2.5,
    unless `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`), so its score GEMMs
    run in fp32, on CUDA cores where TF32 is off (measured in BERT's compiled step on the
    H200)."""
    import torch

    allowed = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    if s.dtype in HALF and not (allowed is not None and allowed()):
        return dataclasses.replace(s, dtype="float32")
    return s


def math_records(s: AttentionShape, train: bool) -> list[OpRecord]:
    """softmax(Q K^T x scale) V as PyTorch's math path runs it, op by op."""
    q, v = tensor((s.bh, s.tq, s.d), s.dtype), tensor((s.bh, s.tk, s.dv), s.dtype)
    kt = tensor((s.bh, s.d, s.tk), s.dtype)
    scores = tensor((s.bh, s.tq, s.tk), s.dtype)
    out = tensor((s.bh, s.tq, s.dv), s.dtype)
    mask = tensor((s.bh, s.tq, s.tk), "bool")
    recs = [
        record("aten.bmm.default", {"self": q, "mat2": kt}, [scores]),
        record("aten.mul.Tensor", {"self": scores}, [scores]),
        record("aten._softmax.default", {"self": scores}, [scores]),
    ]
    if s.has_mask:
        recs.insert(2, record("aten.add.Tensor", {"self": scores, "other": scores}, [scores]))
    if s.dropout:
        recs.append(record("aten.native_dropout.default", {"input": scores}, [scores, mask]))
    recs.append(record("aten.bmm.default", {"self": scores, "mat2": v}, [out]))
    if train:
        recs += _math_backward(s, q, kt, v, scores, out, mask)
    return recs


def _math_backward(s, q, kt, v, scores, out, mask) -> list[OpRecord]:
    vt = tensor((s.bh, s.dv, s.tk), s.dtype)
    st = tensor((s.bh, s.tk, s.tq), s.dtype)
    k = tensor((s.bh, s.tk, s.d), s.dtype)
    back = [
        record("aten.bmm.default", {"self": out, "mat2": vt}, [scores]),  # dP = dO V^T
        record("aten.bmm.default", {"self": st, "mat2": out}, [v]),
    ]  # dV = P^T dO
    if s.dropout:
        back.append(
            record(
                "aten.native_dropout_backward.default",
                {"grad_output": scores, "mask": mask},
                [scores],
            )
        )
    back += [
        record(
            "aten._softmax_backward_data.default",
            {"grad_output": scores, "output": scores},
            [scores],
        ),
        record("aten.mul.Tensor", {"self": scores}, [scores]),
        record("aten.bmm.default", {"self": scores, "mat2": k}, [q]),  # dQ = dS K
        record("aten.bmm.default", {"self": st, "mat2": q}, [k]),
    ]  # dK = dS^T Q
    return [dataclasses.replace(r, phase="backward") for r in back]
