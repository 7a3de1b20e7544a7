"""unfused-softmax-dropout: softmax followed by dropout as separate kernels.

Unfused, the probabilities are written and read back, and dropout writes a boolean mask that
is kept for backward and read there; in backward, dropout's gradient is written and read back
by softmax's. A fused kernel (gpushape.kernels.softmax_dropout) applies dropout in softmax's
epilogue and regenerates the mask from its random seed in backward. Saving, for P bytes of
probabilities and M bytes of mask: 2P + M forward, plus 2P + M in training, of traffic; in
time, the pair's eager kernels as the cost model prices them less a fused kernel's moving the
rest at the rate measured for gpushape's kernel (`AuditContext.fusion_saving_s`). The mask's
bytes are also memory no longer held for backward. Where the softmax belongs to hand-written
attention, manual-attention's fix (SDPA) removes this too.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import DROPOUT_OPS, SOFTMAX_OPS, first_modules, following, module_pattern
from ..registry import register_rule

RULE = "unfused-softmax-dropout"


def find_sites(ops: list[OpRecord]) -> list[tuple[OpRecord, OpRecord]]:
    sites = []
    for pos, rec in enumerate(ops):
        if rec.phase != "forward" or rec.name not in SOFTMAX_OPS or not rec.outputs:
            continue
        nxt = next(following(ops, pos, limit=1), None)
        if (
            nxt is not None
            and nxt.name in DROPOUT_OPS
            and nxt.inputs[0].shape == rec.outputs[0].shape
            and nxt.params.get("train", True) is not False
        ):
            sites.append((rec, nxt))
    return sites


@register_rule(RULE, title="softmax then dropout as separate kernels")
def check(ctx: AuditContext) -> Iterable[Finding]:
    sites = find_sites(ctx.trace.ops)
    if not sites:
        return
    probs = sum(s.outputs[0].nbytes for s, _ in sites)
    mask = sum(d.outputs[1].nbytes for _, d in sites if len(d.outputs) > 1)
    passes = 2 if ctx.train else 1
    nbytes = passes * (2 * probs + mask)
    softmax, dropout = sites[0]
    evidence = {
        "sites": len(sites),
        "shape": list(softmax.outputs[0].shape),
        "dtype": softmax.outputs[0].dtype,
        "p": dropout.params.get("p"),
        "bytes_saved": nbytes,
        "mask_bytes_held_for_backward": mask if ctx.train else 0,
        "modules": first_modules(s.module for s, _ in sites),
    }
    message = (
        f"softmax and dropout run as two kernels at {len(sites)} site(s): the "
        f"probabilities make a round trip through memory and dropout keeps a "
        f"{mask / max(len(sites), 1) / 1e6:,.1f} MB mask per site; a fused kernel saves "
        f"{nbytes / 1e6:,.1f} MB of traffic a step"
    )
    yield ctx.finding(
        RULE,
        module_pattern(s.module for s, _ in sites),
        message,
        evidence,
        saving_s=ctx.fusion_saving_s(
            [r for site in sites for r in site], nbytes, "fused_softmax_dropout"
        ),
        fix="fuse-softmax-dropout",
        replaces=[r for site in sites for r in site],
    )
