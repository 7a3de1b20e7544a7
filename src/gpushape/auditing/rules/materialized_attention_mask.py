"""materialized-attention-mask: a Hugging Face model whose transformers release builds an
all-true attention mask under torch.compile and CUDA graph capture, keeping SDPA off flash.

The trace runs eagerly, where transformers passes SDPA no mask when no padding mask is given,
so the traced attention is the flash kernel. Under torch.compile and while a CUDA stream
captures, releases up to at least 5.17 build an explicit mask instead (`models/hf_masks.py`).
What SDPA then runs depends on the mask's layout (`traced_mask_strided`, asked of the release's
own mask builder), measured on the H200 (`probe_masked_sdpa.json`, torch 2.11):
- a mask with unit stride in its last dimension (5.17's causal masks: GPT-2, LLaMA) runs
  cuDNN's fused kernel, eagerly and compiled, over the whole square of scores: at GPT-2's
  shape 360 us a layer forward and backward against 168 us with is_causal (2.1x), and at
  BERT's 393 against 258 unmasked (1.5x). Priced as that kernel on every score at the rates
  the profile holds for it ("cudnn_masked", fitted on BERT's shape by
  `benchmarks/kernels/fit_masked_sdpa.py`; GPT-2's masked calls then come to 0.95-1.00x
  their measured time);
- a mask expanded from one element (5.17's bidirectional masks: BERT, RoBERTa) is strided, and
  torch.compile lowers the call to the math path (score GEMMs in fp32, softmax and dropout as
  separate kernels: BERT-base MLM compiled ran 0.67x eager). Priced as the math path with a
  mask (pricing/attention.py), in float32 as PyTorch's math path computes half inputs. Captured
  in a CUDA graph, SDPA runs as eagerly, where every mask the probe gave it ran cuDNN's
  kernel: priced as the first case (a strided mask captured is not measured).
Saving: that price minus the traced flash call's, forward and backward, in compile and graph
mode. The unmasked call is cuDNN's causal kernel on the H200, about twice the forced flash
kernel's rate (the profile's "default" attention rows): a LLaMA-style decoder's mask cost
2.2 ms of its compiled step's 19 on the H200 and the H100, which the flash kernel's rate
priced at 0.6. In eager mode it saves nothing, and the finding is info.

A decoder trained without its key/value cache (use_cache=False: the trace saw transformers
check the position ids for packed sequences) gets a causal mask there on any release that
makes that check (`packed_mask_gap`), priced the same way; skip-attention-mask removes that
one too.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...models.hf_masks import packed_mask_gap, traced_mask_gap, traced_mask_strided
from ..context import AuditContext
from ..finding import Finding
from ..patterns import module_pattern
from ..pricing.attention import (
    fused_records,
    math_path_shape,
    math_records,
    traced_shape,
)
from ..registry import register_rule

RULE = "materialized-attention-mask"
QUIET = {
    "eager": "in eager mode transformers already passes SDPA no mask",
    "graph": "the cost model prices the masked fused kernel no slower than flash on this chip",
    "compile": "the cost model prices the masked path no slower than flash on this chip",
}


FLASH = "_scaled_dot_product_flash_attention"


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
    strided = packed is None and traced_mask_strided(model) is True
    fused_s = math_s = square_s = 0.0
    for rec in flash:
        fused_s += ctx.time_s(ctx.with_backward(rec))
        math_s += ctx.price(math_records(math_path_shape(traced_shape(rec, True)), ctx.train))
        # cuDNN's kernel given a mask: every score computed, none skipped as causal
        square_s += ctx.price(fused_records(traced_shape(rec, True), ctx.train, "cudnn"))
    compiled_s = math_s if strided else square_s
    by_mode = {
        "eager": 0.0,
        "compile": max(compiled_s - fused_s, 0.0),
        "graph": max(square_s - fused_s, 0.0),
    }
    evidence = {
        "calls": len(flash),
        "query_shape": list(flash[0].input("query").shape),
        "dtype": flash[0].input("query").dtype,
        "mask_strided": strided,
        "compiled_path": "math, float32" if strided else "fused, whole square",
        "time_flash_s": fused_s,
        "time_math_masked_s": math_s,
        "time_fused_masked_s": square_s,
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
