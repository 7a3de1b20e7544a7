"""dense-mlm-head: a masked LM's head computed at every position, though its loss reads ~15%.

A Hugging Face `*ForMaskedLM` model (BERT, RoBERTa, ALBERT...) runs its head -- for BERT a
dense layer, GELU and LayerNorm, then the vocabulary-wide decoder -- at every position, and its
cross-entropy ignores the positions without a label (-100). BERT-style training labels 15% of
the tokens, so 85% of the head's GEMMs, of the softmax over the vocabulary and of the decoder
bias gradient's reduction is thrown away. The `masked-lm-head` fix runs the head and the loss on
a fixed quarter of the rows, the labelled ones first (the loss and every gradient unchanged;
`logits` comes back for those rows), with no host sync: it pays in eager, compile and graph
mode alike.

The fix keeps a number of rows fixed by the shape, K = `capacity_rows(N)` of the N positions
(the audit's labels are a fixed pattern, models/labels.py, not the step's mask), so the
saving is (1 - K / N) x (the head's traced ops, forward and backward, as the cost model
prices them + the loss's passes over the logits, EAGER_PASSES reads or writes of a
logits-sized tensor at the softmax family's measured rate; COMPILED_PASSES under
torch.compile, which fuses the loss, pricing/loss.py). Training only; quiet for a model
already rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...hardware.alignment import granularity, round_up
from ...models.heads import CAPACITY, MARK, MASKED_FRACTION, capacity_rows, masked_lm_head
from ..context import AuditContext
from ..finding import Finding
from ..pricing.loss import COMPILED_PASSES, EAGER_PASSES
from ..pricing.padding import is_conv, pad_records, parse_misaligned
from ..registry import register_rule

RULE = "dense-mlm-head"


@register_rule(RULE, title="a masked LM's head computed at every position")
def check(ctx: AuditContext) -> Iterable[Finding]:
    model = ctx.model
    if not ctx.train or model is None or MARK in getattr(model, "__dict__", {}):
        return
    spec, _ = masked_lm_head(model)
    if spec is None:
        return
    prefix = spec.head_name + "."
    recs = [
        r
        for r in ctx.forward_compute()
        if r.module == spec.head_name or r.module.startswith(prefix)
    ]
    if not recs:
        return
    ops = [o for r in recs for o in ctx.with_backward(r)]
    head_s = ctx.time_s(ops)
    logits = recs[-1].outputs[0] if recs[-1].outputs else None
    logits_bytes = logits.nbytes if logits is not None else 0
    memory_rate = ctx.gpu.achievable.memory("softmax")
    loss_s = ctx.bytes_time_s(EAGER_PASSES * logits_bytes) / memory_rate
    rows = logits.shape[0] * (logits.shape[1] if len(logits.shape) > 2 else 1) if logits else 0
    kept = capacity_rows(rows)
    share = kept / rows if rows else CAPACITY  # of the rows the head still runs on
    saving = (1.0 - share) * (head_s + loss_s)
    # under torch.compile Inductor pads a misaligned vocabulary's GEMMs itself: the head it
    # runs, and so what the fix saves, is the padded one's (BERT at 32 x 512 on the H200,
    # compiled: 4.6 ms of GPU time saved, against 10.1 priced at the misaligned rate)
    compiled_s = _aligned_s(ctx, ops)
    evidence = {
        "head": spec.head_name,
        "vocabulary": spec.vocab_size,
        "positions": rows,
        "rows_kept": kept,
        "capacity": CAPACITY,
        "labelled_share_assumed": MASKED_FRACTION,
        "head_time_s": head_s,
        "loss_time_s": loss_s,
        "logits_bytes": logits_bytes,
    }
    if compiled_s < head_s:
        evidence["head_time_compiled_s"] = compiled_s
    # Inductor also fuses the loss: COMPILED_PASSES over the logits where eager makes six
    compiled_loss_s = loss_s * COMPILED_PASSES / EAGER_PASSES
    compiled_saving = (1.0 - share) * (min(compiled_s, head_s) + compiled_loss_s)
    evidence["saving_by_mode_s"] = {"compile": compiled_saving}
    message = (
        f"the masked-LM head `{spec.head_name}` computes {spec.vocab_size:,}-wide logits at "
        f"all {rows:,} positions, but the loss reads only the labelled ones (~15% in BERT-style "
        f"training): running the head and the loss on {kept:,} rows, the labelled ones first, "
        f"skips {1 - share:.0%} of its GEMMs and of the softmax (masked-lm-head, "
        f"no host sync; the logits then come back for those rows, and more than "
        f"{CAPACITY:.0%} of the positions labelled is an error)"
    )
    yield ctx.finding(
        RULE, spec.head_name, message, evidence, saving_s=saving, fix="masked-lm-head",
        replaces=recs,
    )  # fmt: skip


def _aligned_s(ctx: AuditContext, ops: list) -> float:
    """The ops' time with every misaligned GEMM dimension padded to the chip's granularity."""
    padded, done = list(ops), set()
    for rec in ops:
        cost = ctx.op_cost(rec)
        for text in cost.misaligned:
            parsed = parse_misaligned(text)
            if parsed is None or is_conv(rec) or parsed[1] in done:
                continue
            value = parsed[1]
            done.add(value)
            multiple = granularity("gemm", ctx.gpu, cost.math)
            padded = pad_records(padded, value, round_up(value, multiple))
    return ctx.price(padded)
