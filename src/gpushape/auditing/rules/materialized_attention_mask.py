"""materialized-attention-mask: a Hugging Face model whose transformers release builds an
all-true attention mask under torch.compile and CUDA graph capture, keeping SDPA off flash.

The trace runs eagerly, where transformers passes SDPA no mask when no padding mask is given,
so the traced attention is the flash kernel. Under torch.compile and while a CUDA stream
captures, releases up to at least 5.17 build an explicit mask instead (`models/hf_masks.py`):
measured on the H200, torch.compile of BERT-base MLM then lowered attention to the math path
(score GEMMs in fp32, softmax and dropout as separate kernels), 0.67x eager, and the captured
GPT-2 step ran 966 kernels against eager's 611. Saving, per mode, for the traced SDPA calls
without a mask, forward and backward, as the cost model prices them: compile, the math path
with a mask (pricing/attention.py), in float32 as PyTorch's math path computes half inputs,
minus flash; graph, the memory-efficient kernel (what eager SDPA takes for
a masked call) minus flash. In eager mode it saves nothing, and the finding is info.

A decoder trained without its key/value cache (use_cache=False: the trace saw transformers
check the position ids for packed sequences) gets a causal mask there on any release that
makes that check (`packed_mask_gap`), priced the same way; skip-attention-mask removes that
one too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...models.hf_masks import packed_mask_gap, traced_mask_gap
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import module_pattern
from ..pricing.attention import (
    AttentionShape,
    fused_backend,
    fused_records,
    math_path_shape,
    math_records,
)
from ..registry import register_rule

RULE = "materialized-attention-mask"
QUIET = {
    "eager": "in eager mode transformers already passes SDPA no mask",
    "graph": "the cost model prices the masked memory-efficient kernel no slower than flash "
    "on this chip",
    "compile": "the cost model prices the masked math path no slower than flash on this chip",
}


FLASH = "_scaled_dot_product_flash_attention"


def _shape(rec: OpRecord, has_mask: bool) -> AttentionShape:
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


@register_rule(RULE, title="an all-true attention mask under torch.compile or CUDA graphs")
def check(ctx: AuditContext) -> Iterable[Finding]:
    model = ctx.model
    if model is None:
        return
    packed = packed_mask_gap(model) if ctx.observed.packing_checks else None
    why = packed or traced_mask_gap(model)
    if why is None:
        return
    flash = [r for r in ctx.forward_compute() if r.name == FLASH]
    if not flash:
        return
    fused_s = math_s = efficient_s = 0.0
    for rec in flash:
        masked = _shape(rec, True)
        fused_s += ctx.time_s(ctx.with_backward(rec))
        math_s += ctx.price(math_records(math_path_shape(masked), ctx.train))
        backend = fused_backend(masked)
        alternative = (
            fused_records(masked, ctx.train, backend)
            if backend is not None
            else math_records(masked, ctx.train)
        )
        efficient_s += ctx.price(alternative)
    by_mode = {
        "eager": 0.0,
        "compile": max(math_s - fused_s, 0.0),
        "graph": max(efficient_s - fused_s, 0.0),
    }
    evidence = {
        "calls": len(flash),
        "query_shape": list(flash[0].input("query").shape),
        "dtype": flash[0].input("query").dtype,
        "time_flash_s": fused_s,
        "time_math_masked_s": math_s,
        "time_efficient_masked_s": efficient_s,
        "saving_by_mode_s": by_mode,
        # the compiled or captured step runs the masked path: a cost on top of the traced one
        "cost_in_mode_s": {m: s for m, s in by_mode.items() if m != "eager"},
        "why_quiet": QUIET,
    }
    remedy = (
        "skip-attention-mask passes no mask where no padding mask is given, as the eager path does"
        if packed is None
        else "skip-attention-mask has transformers read the model's own positions as one "
        "sequence a row there, as it finds them eagerly"
    )
    message = (
        f"{why}: {len(flash)} attention call(s) run flash eagerly but the masked path when "
        f"compiled or captured ({remedy})"
    )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in flash),
        message,
        evidence,
        saving_s=by_mode["compile"],
        fix="skip-attention-mask",
        replaces=flash,
    )
