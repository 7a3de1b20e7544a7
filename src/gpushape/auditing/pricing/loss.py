"""A cross-entropy over vocabulary-wide logits, as eager PyTorch runs it and as Inductor does.

Eager, a Hugging Face LM's loss is separate kernels over the logits: GPT-2 casts them to
float32 first (`_to_copy`), then `_log_softmax` (read, write), `nll_loss_forward`, and in the
backward `nll_loss_backward` (a zero-filled gradient of the logits' size),
`_log_softmax_backward_data` (two reads, a write) and the cast back: the trace holds them when
the audit passes labels (models/labels.py), each priced like any traced op. Under
torch.compile, Inductor fuses the chain into two reductions: the forward reads the logits once
(an online log-sum-exp), the backward reads them again and writes their gradient, COMPILED_PASSES
passes over the logits in the model's dtype at the softmax family's measured rate. GPT-2 at 32
x 1024 compiled on the H200 ran those two kernels in 2.8 and 3.3 ms over 3.3 GB of bf16
logits (bench-h200/gpt2-b32.json): 1.6 TB/s for three passes, where the eager-priced chain
would take four times as long.
"""

from __future__ import annotations

from typing import Any

LOSS_OPS = frozenset(
    {"_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"}
)
EAGER_PASSES = 6  # log_softmax forward (2), its backward (3), NLL's zero-filled gradient (1)
COMPILED_PASSES = 3  # Inductor: the forward reads once; the backward reads and writes


def loss_chain(trace: Any) -> tuple[list[Any], int, int]:
    """(the traced ops of every cross-entropy over logits, the logits' elements, the bytes of
    one element in the model's dtype): the log-softmax and NLL ops forward and backward, and
    the casts of the logits into and out of them (same module, same element count)."""
    softmaxes = [r for r in trace.ops if r.name == "_log_softmax" and r.inputs]
    if not softmaxes:
        return [], 0, 0
    sizes = {(r.module, r.inputs[0].numel) for r in softmaxes}
    ops = [
        r
        for r in trace.ops
        if r.name in LOSS_OPS
        or (r.name == "_to_copy" and r.inputs and (r.module, r.inputs[0].numel) in sizes)
    ]
    elements = sum(r.inputs[0].numel for r in softmaxes)
    casts = [r for r in ops if r.name == "_to_copy" and r.phase == "forward"]
    source = casts[0].inputs[0] if casts else softmaxes[0].inputs[0]  # before any upcast
    return ops, elements, source.itemsize


def compiled_loss_saving_s(ctx: Any) -> float:
    """GPU seconds the traced eager loss costs beyond Inductor's fused one (0 without a loss)."""
    ops, elements, itemsize = loss_chain(ctx.trace)
    if not ops:
        return 0.0
    eager = sum(ctx.op_cost(r).kernel_time_s for r in ops)  # the step's GPU side: kernels
    rate = ctx.gpu.achievable.memory("softmax")
    fused = ctx.bytes_time_s(COMPILED_PASSES * elements * itemsize) / rate
    return max(eager - fused, 0.0)
