"""SDPA on meta takes the kernel CUDA's dispatcher would pick: one row per rule of
`routing.sdpa_backend` (flash, memory-efficient or the math path), checked on the selection and
on the trace it gives (the fused op recorded, or the math path's bmm and softmax)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, ops_named, trace_fn, work
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpushape.tracing.routing import route_sdpa, sdpa_backend

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
B, H, T, D = 2, 4, 16, 64


@dataclass(frozen=True)
class Case:
    """One SDPA call: shapes as (heads, seq, head size), batch B; mask a shape or None."""

    expected: str
    q: tuple[int, int, int] = (H, T, D)
    k: tuple[int, int, int] | None = None  # default: as q
    v: tuple[int, int, int] | None = None  # default: as k
    dtype: torch.dtype = BF16
    mask: tuple[int, ...] | None = None
    mask_dtype: torch.dtype = torch.bool
    kwargs: dict = field(default_factory=dict)

    def tensors(self, requires_grad: bool = False):
        k = self.k or self.q
        v = self.v or k
        q, k, v = (
            meta(B, *s, dtype=self.dtype, requires_grad=requires_grad) for s in (self.q, k, v)
        )
        mask = None
        if self.mask is not None:
            dtype = self.mask_dtype if self.mask_dtype == torch.bool else self.dtype
            mask = torch.empty(self.mask, dtype=dtype, device="meta")
        return q, k, v, mask


CASES = {
    # flash: half, no mask, equal head sizes up to 256
    "bf16": Case("flash"),
    "fp16": Case("flash", dtype=FP16),
    "causal square": Case("flash", kwargs={"is_causal": True}),
    "dropout": Case("flash", kwargs={"dropout_p": 0.1}),
    "explicit scale": Case("flash", kwargs={"scale": 0.5}),
    "head 256": Case("flash", q=(H, T, 256)),
    "head 60, padded to 64": Case("flash", q=(H, T, 60)),
    "gqa": Case("flash", k=(1, T, D), kwargs={"enable_gqa": True}),
    "gqa causal": Case(
        "flash", q=(8, T, D), k=(2, T, D), kwargs={"enable_gqa": True, "is_causal": True}
    ),
    "gqa flag, equal heads": Case("flash", kwargs={"enable_gqa": True}),
    # memory-efficient: masks, fp32, unequal V head size, causal with unequal lengths
    "bool mask": Case("efficient", mask=(B, 1, 1, T)),
    "additive mask": Case("efficient", mask=(B, 1, T, T), mask_dtype=BF16),
    "square bool mask": Case("efficient", mask=(T, T)),
    "fp32": Case("efficient", dtype=FP32),
    "fp32 head 4": Case("efficient", q=(H, T, 4), dtype=FP32),
    "head 264": Case("efficient", q=(H, T, 264)),
    "v head 32": Case("efficient", v=(H, T, 32)),
    "causal 8 queries, 16 keys": Case(
        "efficient", q=(H, 8, D), k=(H, T, D), kwargs={"is_causal": True}
    ),
    "mask, gqa flag, equal heads": Case(
        "efficient", mask=(B, 1, 1, T), kwargs={"enable_gqa": True}
    ),
    # the math path, as on CUDA
    "fp32 head 6": Case("math", q=(H, T, 6), dtype=FP32),
    "fp64": Case("math", dtype=torch.float64),
    "head 60 with a mask": Case("math", q=(H, T, 60), mask=(B, 1, 1, T)),
    "gqa with a mask": Case("math", k=(1, T, D), mask=(B, 1, 1, T), kwargs={"enable_gqa": True}),
    "gqa fp32": Case("math", k=(1, T, D), dtype=FP32, kwargs={"enable_gqa": True}),
    "gqa, head 264": Case("math", q=(H, T, 264), k=(1, T, 264), kwargs={"enable_gqa": True}),
}


def _call(case: Case, requires_grad: bool = False):
    q, k, v, mask = case.tensors(requires_grad)
    return (q, k, v), {"attn_mask": mask, **case.kwargs}


@pytest.mark.parametrize("name", CASES)
def test_backend_chosen(name):
    case = CASES[name]
    args, kwargs = _call(case)
    assert sdpa_backend(*args, **kwargs) == case.expected


@pytest.mark.parametrize("name", CASES)
def test_trace_runs_the_chosen_kernel(name):
    case = CASES[name]
    args, kwargs = _call(case, requires_grad=True)
    t = trace_fn(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), args, train=True
    )
    names = {op.name for op in t.ops}
    if case.expected == "math":
        assert "bmm" in names and not any("_scaled_dot_product" in n for n in names)
        return
    op = f"_scaled_dot_product_{case.expected}_attention"
    assert {op, f"{op}_backward"} <= names and "bmm" not in names


def test_gqa_flash_counts_query_heads_and_gives_key_grads_of_key_heads():
    q = meta(B, 8, T, D, dtype=BF16, requires_grad=True)
    k = meta(B, 2, T, D, dtype=BF16, requires_grad=True)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    t = trace_fn(fn, (q, k, k), train=True)
    (fwd,) = ops_named(t, "_scaled_dot_product_flash_attention")
    (bwd,) = ops_named(t, "_scaled_dot_product_flash_attention_backward")
    assert work(fwd).flops == 2 * B * 8 * T * T * (D + D)
    assert [o.shape for o in bwd.outputs[:3]] == [(B, 8, T, D), (B, 2, T, D), (B, 2, T, D)]


def test_flash_pads_a_head_size_off_8_and_slices_the_output_back():
    q = meta(B, H, T, 60, dtype=BF16)
    out = route_sdpa(q, q, q)
    assert out is not None and out.shape == (B, H, T, 60)
    t = trace_fn(F.scaled_dot_product_attention, (q, q, q))
    (fwd,) = ops_named(t, "_scaled_dot_product_flash_attention")
    assert fwd.input("query").shape == (B, H, T, 64)
    assert len(ops_named(t, "constant_pad_nd")) == 3
    assert fwd.params.get("scale") == pytest.approx(60**-0.5)  # the unpadded size's scale


def test_a_mask_off_8_is_padded_before_the_efficient_kernel():
    q = meta(B, H, 10, D, dtype=BF16)
    mask = torch.empty(B, 1, 1, 10, dtype=torch.bool, device="meta")
    t = trace_fn(lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m), (q, mask))
    assert ops_named(t, "where") and ops_named(t, "constant_pad_nd")
    (fwd,) = ops_named(t, "_scaled_dot_product_efficient_attention")
    assert (
        fwd.input("attn_bias").shape == (B, H, 10, 10)
        and fwd.input("attn_bias").dtype == "bfloat16"
    )


def test_a_mask_of_strided_last_dim_takes_the_math_path():
    q = meta(B, H, T, D, dtype=BF16)
    mask = torch.empty(B, 1, 1, 1, dtype=torch.bool, device="meta").expand(B, 1, 1, T)
    assert sdpa_backend(q, q, q, mask) == "math"


def test_mask_with_is_causal_is_left_to_torch_to_reject():
    q = meta(B, H, T, D, dtype=BF16)
    mask = torch.empty(T, T, dtype=torch.bool, device="meta")
    assert sdpa_backend(q, q, q, mask, is_causal=True) == "math"
    assert route_sdpa(q, q, q, mask, is_causal=True) is None


def test_unbatched_and_strided_inputs_take_the_math_path():
    three_d = meta(H, T, D, dtype=BF16)
    assert sdpa_backend(three_d, three_d, three_d) == "math"
    strided = meta(B, H, T, 2 * D, dtype=BF16)[..., ::2]
    assert sdpa_backend(strided, strided, strided) == "math"


@pytest.mark.parametrize(
    "enabled,expected",
    [
        ([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION], "flash"),
        ([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], "efficient"),
        ([SDPBackend.MATH], "math"),
    ],
)
def test_sdpa_kernel_blocks_are_obeyed(enabled, expected):
    q = meta(B, H, T, D, dtype=BF16)
    with sdpa_kernel(enabled):
        assert sdpa_backend(q, q, q) == expected


class _Broadcast(torch.nn.Module):
    """Multi-query attention passing one K/V head to SDPA without enable_gqa (as Hugging Face's
    Falcon does): CUDA takes the math path, which computes half inputs in fp32."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.proj(x).view(b, t, 4, 16).transpose(1, 2)
        kv = x[..., :16].unsqueeze(1)  # (b, 1, t, 16): one head, broadcast over the four
        return F.scaled_dot_product_attention(q, kv, kv, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_math_paths_ops_on_half_inputs_are_tagged(dtype):
    import gpushape
    from gpushape.auditing import audit
    from gpushape.tracing.recorder import SDPA_MATH

    x = torch.empty(2, 128, 64, device="meta", dtype=dtype)
    trace = gpushape.trace(_Broadcast(dtype), (x,), train=True)
    tagged = [r for r in trace.ops if SDPA_MATH in r.tags]
    bmms = [r for r in trace.ops if r.phase == "forward" and "bmm" in r.op]
    assert len(bmms) == 2  # the math path's Q K^T and @ V
    if dtype == torch.bfloat16:
        assert tagged and all(r.phase == "forward" for r in tagged)
        assert {r.module for r in tagged} == {""}  # the SDPA call's module, the root
    else:  # fp32 by the model's choice: autocast would change it, nothing tagged
        assert not tagged
    report = audit(_Broadcast(dtype), (x,), "h200", dtype=dtype, train=True, mode="graph")
    fp32 = [f for f in report.findings if f.rule == "fp32-math"]
    if dtype == torch.bfloat16:
        assert not fp32  # the upcast is the math path's, not the model's
    else:
        assert "bmm" in fp32[0].evidence["op_kinds"]
