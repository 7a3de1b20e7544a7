"""manual-attention: softmax(Q K^T) V written out by hand instead of scaled_dot_product_attention.

Pattern (forward): a batched matmul whose output is the score matrix, elementwise ops on it
(scale, mask), softmax, optionally dropout, and a batched matmul of the probabilities with V.
Written out, the (BH, Tq, Tk) scores go through memory several times each way; the fused
kernels keep them on chip. Saving: the traced ops of the pattern (with the copies that feed
the first matmul, and every backward op autograd ran for them) as the cost model prices them,
minus the fused SDPA kernel for the same shapes (pricing/attention.py), forward and backward.
With a mask, SDPA takes the memory-efficient kernel; over a square score matrix a lone (T, T)
mask may be the causal one (the trace sees that there is a mask, not its values), so the
finding also prices flash with is_causal=True and no mask, and says so conditionally. A term
over keys alone besides it (a padding mask, ALiBi's bias: MPT adds it, Bloom passes it as
baddbmm's first input) stays a mask under SDPA, and no such hint is given. A Hugging Face
model whose class has no sdpa path (Bloom, MPT) is told so: optimize cannot switch it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ...models.hf_masks import is_hf_model
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding, Severity
from ..patterns import BMM_OPS, DROPOUT_OPS, SOFTMAX_OPS, following, module_pattern, preceding
from ..pricing.attention import (
    FLASH_MAX_HEAD_DIM,
    HALF,
    AttentionShape,
    fused_backend,
    fused_records,
)
from ..registry import register_rule

RULE = "manual-attention"
MAX_STEPS = 4


def _scores_producer(ops: list[OpRecord], pos: int) -> tuple[OpRecord, list[OpRecord]] | None:
    """The bmm that made softmax `ops[pos]`'s input, and the elementwise ops in between. Ops
    that neither read nor write a score-sized tensor (`~mask` on a (T, T) or (B, 1, 1, T)
    boolean mask, computed between the two) are side work, skipped."""
    numel, between = ops[pos].inputs[0].numel, []
    for rec in preceding(ops, pos, limit=2 * MAX_STEPS):
        if not rec.outputs or rec.outputs[0].numel != numel:
            if any(t.numel == numel for t in rec.inputs):
                return None  # the scores went into something else: not this pattern
            continue
        if rec.name in BMM_OPS:
            return rec, between
        between.append(rec)
        if len(between) >= MAX_STEPS:
            return None
    return None


def _probs_consumer(ops: list[OpRecord], pos: int) -> tuple[OpRecord, list[OpRecord]] | None:
    """The bmm that multiplies the probabilities by V, and the ops in between (dropout, the
    copy of V that a 4-D matmul makes)."""
    numel, between = ops[pos].outputs[0].numel, []
    for rec in following(ops, pos, limit=MAX_STEPS):
        if rec.name in BMM_OPS and _operands(rec)[0].numel == numel:
            return rec, between
        between.append(rec)
    return None


def _operands(rec: OpRecord) -> tuple:
    """A batched matmul's two factors: baddbmm's first input is the added term (Bloom's ALiBi
    bias), its factors the next two."""
    return (
        (rec.inputs[1], rec.inputs[2]) if rec.name == "baddbmm" else (rec.inputs[0], rec.inputs[1])
    )


def _feeding_copies(ops: list[OpRecord], bmm: OpRecord) -> list[OpRecord]:
    """Copies made right before the first bmm (contiguous Q and K^T for a 4-D matmul)."""
    out = []
    for rec in preceding(ops, bmm.index, limit=2):  # a record's index is its trace position
        if rec.name != "clone" or rec.module != bmm.module:
            break
        out.append(rec)
    return out


def _mask_terms(rec: OpRecord) -> list:
    """What an op between the matmul and softmax applies to the scores: the inputs besides the
    scores themselves (a mask added, filled or selected with); baddbmm's added term (Bloom's
    ALiBi). A cast or a scale applies nothing."""
    if rec.name in BMM_OPS:
        return [rec.inputs[0]] if rec.name == "baddbmm" else []
    if rec.name in ("div", "mul") or not rec.outputs:
        return []
    numel = rec.outputs[0].numel
    scores = next((i for i, t in enumerate(rec.inputs) if t.numel == numel), None)
    return [t for i, t in enumerate(rec.inputs) if i != scores]


def _per_query(term, tq: int) -> bool:
    """Whether a mask term varies over the tq query positions ((T, T) as a causal mask does; a
    key-padding mask or ALiBi's (.., 1, T) bias does not)."""
    return len(term.shape) >= 2 and term.shape[-2] == tq > 1


def find_sites(ops: list[OpRecord]) -> list[dict]:
    sites = []
    for pos, rec in enumerate(ops):
        if rec.phase != "forward" or rec.name not in SOFTMAX_OPS:
            continue
        before, after = _scores_producer(ops, pos), _probs_consumer(ops, pos)
        if before is None or after is None:
            continue
        (bmm1, pre), (bmm2, post) = before, after
        (q, kt), v = (t.shape for t in _operands(bmm1)), _operands(bmm2)[1].shape
        # every term reaches SDPA as its attn_mask (an added one, baddbmm's ALiBi, additive);
        # only one that varies over queries, with no other term, may be the causal mask
        terms = [t for r in (bmm1, *pre) for t in _mask_terms(r)]
        per_query = [_per_query(t, q[-2]) for t in terms]
        shape = AttentionShape(
            bh=q[0],
            tq=q[-2],
            tk=kt[-1],
            d=q[-1],
            dv=v[-1],
            dtype=bmm1.inputs[0].dtype,
            has_mask=bool(terms),
            dropout=any(r.name in DROPOUT_OPS for r in post),
            mask_per_query=bool(per_query) and all(per_query),
        )
        recs = [*_feeding_copies(ops, bmm1), bmm1, *pre, rec, *post, bmm2]
        sites.append({"module": bmm1.module, "shape": shape, "ops": recs})
    return sites


def _could_be_causal(s: AttentionShape) -> bool:
    """A (T, T) mask over a square score matrix in half precision: if it is the causal one,
    flash runs it with is_causal=True (the trace sees a mask's shape, not its values)."""
    return (
        s.has_mask
        and s.mask_per_query
        and s.tq == s.tk
        and s.dtype in HALF
        and s.d == s.dv
        and s.d <= FLASH_MAX_HEAD_DIM
    )


@register_rule(RULE, title="softmax(QK^T)V written by hand instead of SDPA")
def check(ctx: AuditContext) -> Iterable[Finding]:
    sites = find_sites(ctx.trace.ops)
    if not sites:
        return
    manual_s = fused_s = causal_s = 0.0
    for site in sites:
        shape = site["shape"]
        site_s = sum(ctx.time_s(ctx.with_backward(r)) for r in site["ops"])
        backend = fused_backend(shape)
        manual_s += site_s
        fused_s += ctx.price(fused_records(shape, ctx.train, backend)) if backend else site_s
        if _could_be_causal(shape):  # a mask of the causal kind: is_causal=True, no mask
            unmasked = dataclasses.replace(shape, has_mask=False)
            causal_s += ctx.price(fused_records(unmasked, ctx.train, "flash", causal=True))
    s = sites[0]["shape"]
    backend = fused_backend(s)
    saving_s = max(manual_s - fused_s, 0.0)
    evidence = {
        "sites": len(sites),
        "batch_x_heads": s.bh,
        "q_len": s.tq,
        "kv_len": s.tk,
        "head_dim": s.d,
        "dtype": s.dtype,
        "mask": s.has_mask,
        "dropout": s.dropout,
        "score_matrix_bytes": s.score_bytes(),
        "fused_kernel": backend,
        "time_manual_s": manual_s,
        "time_fused_s": fused_s,
    }
    message = (
        f"attention written out by hand at {len(sites)} site(s): the "
        f"{s.tq}x{s.tk} score matrix goes through memory ({s.score_bytes() / 1e6:,.1f} MB "
        f"per site); F.scaled_dot_product_attention runs it as one "
        f"{backend or 'fused'} kernel"
    )
    if backend and saving_s <= 0:
        message += (
            f", which on {ctx.gpu.name} is no faster for these shapes"
            f"{' with a mask and dropout' if s.has_mask and s.dropout else ''}: "
            "the gain is the score matrix not kept for the backward"
        )
    if causal_s:
        evidence["time_fused_if_causal_s"] = causal_s
        if manual_s > causal_s:
            message += (
                f" (if the mask is causal, is_causal=True without it lets flash skip "
                f"the masked half: {(manual_s - causal_s) * 1e3:,.2f} ms saved instead)"
            )
    model = ctx.model
    if is_hf_model(model) and not getattr(model, "_supports_sdpa", True):
        # the sdpa transform switches transformers' own path: none here (Bloom's ALiBi)
        message += (
            f"; transformers has no sdpa path for {type(model).__name__}, so optimize's sdpa "
            "switch refuses it: the attention module would need rewriting by hand"
        )
    severity = None if backend else Severity.INFO
    yield ctx.finding(
        RULE,
        module_pattern(x["module"] for x in sites),
        message,
        evidence,
        saving_s=saving_s,
        fix="sdpa",
        severity=severity,
        replaces=[r for site in sites for r in site["ops"]],
    )
