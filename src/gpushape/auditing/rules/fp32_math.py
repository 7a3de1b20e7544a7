"""fp32-math: matmuls and convolutions in fp32 on CUDA cores, on a chip with tensor cores.

PyTorch runs fp32 matmuls on CUDA cores unless TF32 is allowed
(`torch.backends.cuda.matmul.allow_tf32`, or a float32 matmul precision other than "highest")
and fp32 convolutions on TF32 tensor cores unless `torch.backends.cudnn.allow_tf32` is off;
autocast moves both to bf16/fp16. The trace's cost model prices each op at the rate these
flags give (its math mode). The saving is the op and its backward as priced, minus the same
ops at the chip's half-precision tensor-core rate (bf16, or fp16 where the chip has no bf16
tensor cores), as autocast would run them; bytes are kept as traced (fp32), so the estimate
is low by whatever halving the activations would add. The TF32 figure is in the evidence for
those who must keep fp32 storage. The fp32 matmuls of an SDPA call on half inputs that CUDA
runs on its math path (as it does for K/V heads that neither match the query's nor are
grouped with `enable_gqa`) are not counted: the math path upcasts them whatever the model's
dtype, and autocast would not change that. Where the model casts a site's 16-bit operands to
fp32 itself (GPT-Neo's eager attention upcasts its queries and keys, for the softmax's sake),
the message says so: the fp32 is the authors' choice, and autocast overrides it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...tracing.recorder import SDPA_MATH
from ..context import AuditContext
from ..finding import Finding
from ..patterns import first_modules, module_pattern
from ..registry import register_rule

RULE = "fp32-math"
_CASTS = ("_to_copy", "to")
_HALF = ("bfloat16", "float16")


def _fast_math(ctx: AuditContext) -> str | None:
    for key in ("bf16", "fp16", "tf32"):
        if ctx.gpu.has_tensor_cores(key):
            return key
    return None


def upcast_by_model(ctx: AuditContext, sites) -> list:
    """The sites whose fp32 operands the model made itself by casting 16-bit tensors."""
    made = {t.storage: r for r in ctx.forward_compute() for t in r.outputs if t.storage is not None}

    def upcast(t) -> bool:
        src = made.get(t.storage)
        return (
            src is not None
            and src.name in _CASTS
            and bool(src.inputs)
            and str(src.inputs[0].dtype) in _HALF
        )

    return [r for r in sites if any(upcast(t) for t in r.inputs if str(t.dtype) == "float32")]


@register_rule(RULE, title="fp32 matmul/conv without TF32 or autocast on a tensor-core chip")
def check(ctx: AuditContext) -> Iterable[Finding]:
    fast = _fast_math(ctx)
    if fast is None:
        return
    sites = [
        r
        for r in ctx.forward_compute()
        if ctx.op_cost(r).gemms
        and ctx.op_cost(r).math == "fp32"
        and not ctx.op_cost(r).tensor_cores
        and SDPA_MATH not in r.tags  # SDPA's math path upcasts half inputs: not the model's fp32
    ]
    if not sites:
        return
    recs = [rec for r in sites for rec in ctx.with_backward(r)]
    as_is_s = ctx.time_s(recs)
    fast_s = ctx.price(recs, fast)
    tf32_s = ctx.price(recs, "tf32") if ctx.gpu.has_tensor_cores("tf32") else None
    saving_s = max(as_is_s - fast_s, 0.0)
    evidence = {
        "ops": len(sites),
        "dtype": "fp32",
        "flags": ctx.flags.to_dict(),
        "time_as_is_s": as_is_s,
        f"time_{fast}_s": fast_s,
        "modules": first_modules(r.module for r in sites),
        "op_kinds": sorted({r.name for r in sites}),
    }
    if tf32_s is not None:
        evidence["time_tf32_s"] = tf32_s
    message = (
        f"{len(sites)} matmuls/convolutions run fp32 on CUDA cores: autocast to {fast} "
        f"(or allow TF32) puts them on tensor cores"
    )
    cast = upcast_by_model(ctx, sites)
    evidence["upcast_by_model"] = len(cast)
    if cast:
        message += (
            f"; the model casts {len(cast)} of them from 16-bit to fp32 itself "
            f"({module_pattern(r.module for r in cast)}), a choice of its authors that "
            "autocast overrides (TF32 keeps fp32's range)"
        )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in sites),
        message,
        evidence,
        saving_s=saving_s,
        replaces=sites,
        fix="autocast-bf16",
    )
