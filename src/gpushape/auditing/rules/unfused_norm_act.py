"""unfused-norm-act: a normalization feeds an elementwise activation as separate kernels.

Pattern (forward, program order): a normalization, then at most a residual add on a tensor of
its shape, then an activation reading that shape, where fuse-norm-act can fuse them (`FUSABLE`:
BatchNorm2d [+ add] -> ReLU, SiLU, GELU or Hardswish; timm's BatchNormAct2d with one of those;
LayerNorm -> GELU; a GroupNorm, an RMSNorm or another activation has no fused kernel to offer).
An in-place SiLU or Hardswish comes after a clone (autograd keeps their input): it counts among
the intermediates. Unfused, every tensor between the norm and the activation is written to
memory and read back; fused, the activation is the norm kernel's epilogue. Saving per
intermediate tensor of B bytes: 2B in the forward, and in training 2B more for its gradient
(written by the activation's backward, read by the norm's). The saving is the chain's time as
the cost model prices its eager kernels (each family at its measured efficiency) less a fused
kernel's moving the remaining bytes at the rate measured for gpushape's kernel of that fix
(`AuditContext.fusion_saving_s`): BatchNormAct2d for a BatchNorm chain, LayerNormGELU for the
others (and for BatchNorm where the first is not measured). In training, a BatchNorm -> ReLU
chain whose output's gradient autograd adds from two users (a ResNet block's output: the next
block's convolution and residual, or its downsampling branch) also loses that add: the fused
backward reads the two parts itself (`handed_over_adds`).

Also the other way round: a residual add whose sum a LayerNorm normalizes next (BERT's
`LayerNorm(hidden + input)`, a pre-norm block's residual stream). Unfused, the sum is written
and read back by the norm, and in training the norm's input gradient is written and then added
to the gradient reaching the sum from its other users; gpushape's AddLayerNorm reads both
operands and writes the normalized output and the sum in one kernel. Saving per sum of S
bytes: S forward, 2S more in training.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import (
    ACTIVATION_OPS,
    BATCH_NORM_OPS,
    BINARY_POINTWISE_OPS,
    NORM_OPS,
    first_modules,
    following,
    module_pattern,
    reads_like,
)
from ..registry import register_rule

RULE = "unfused-norm-act"
MAX_BETWEEN = 2  # ops allowed between the norm and the activation: an add, a clone
_BN_ACTS = frozenset({"relu", "silu", "gelu", "hardswish"})
# The norm module's type -> (activations its fused kernel takes, residual adds allowed between):
# what fuse-norm-act rewrites (transforms/fuse_norm_act.py); a finding promises no other fix.
FUSABLE = {
    "BatchNorm2d": (_BN_ACTS, 1),
    "BatchNormAct2d": (_BN_ACTS, 0),  # timm's: batch_norm, then its own act
    "LayerNorm": (frozenset({"gelu"}), 0),
}


@dataclass(frozen=True)
class Chain:
    norm: OpRecord
    ops: tuple[OpRecord, ...]  # what follows the norm, the activation last

    @property
    def pattern(self) -> str:
        return "->".join([self.norm.module_type or self.norm.name, *(o.name for o in self.ops)])

    @property
    def intermediate_bytes(self) -> int:
        """Bytes of the tensors written before the activation: the norm's and each op's."""
        return sum(r.outputs[0].nbytes for r in (self.norm, *self.ops[:-1]))


def fusable(chain: Chain) -> bool:
    """Whether fuse-norm-act can fuse this chain (`FUSABLE`)."""
    acts, adds = FUSABLE.get(chain.norm.module_type or "", (frozenset(), 0))
    between = [op.name for op in chain.ops[:-1] if op.name != "clone"]
    return (
        chain.ops[-1].name.rstrip("_") in acts
        and len(between) <= adds
        and all(name in ("add", "add_") for name in between)
    )


def find_chains(ops: list[OpRecord]) -> list[Chain]:
    """Every norm -> [elementwise ops] -> activation chain, fusable or not (see `fusable`)."""
    chains = []
    for pos, rec in enumerate(ops):
        if rec.phase != "forward" or rec.name not in NORM_OPS or not rec.outputs:
            continue
        produced, between = rec.outputs[0], []
        for nxt in following(ops, pos, limit=MAX_BETWEEN + 1):
            if not reads_like(nxt, produced):
                break
            between.append(nxt)
            if nxt.name in ACTIVATION_OPS:
                chains.append(Chain(rec, tuple(between)))
                break
            if nxt.name not in BINARY_POINTWISE_OPS | {"clone"} or not nxt.outputs:
                break
            produced = nxt.outputs[0]
    return chains


ADD_OPS = frozenset({"add", "add_"})


def find_add_norms(ops: list[OpRecord]) -> list[tuple[OpRecord, OpRecord]]:
    """(add, LayerNorm) where the next op after a two-tensor add normalizes its sum, both in
    the norm's parent's forward (where fuse-norm-act can rewrite them; a sum a block returns
    and the next block normalizes is not)."""
    pairs = []
    for pos, rec in enumerate(ops):
        if rec.phase != "forward" or rec.name not in ADD_OPS or not rec.outputs:
            continue
        if len(rec.inputs) != 2 or rec.inputs[0].shape != rec.inputs[1].shape:
            continue
        nxt = next(following(ops, pos, limit=1), None)
        if (
            nxt is not None
            and nxt.name == "native_layer_norm"
            and nxt.module_type == "LayerNorm"
            and reads_like(nxt, rec.outputs[0])
            and rec.module == nxt.module.rpartition(".")[0]  # the norm's parent adds: fusable
        ):
            pairs.append((rec, nxt))
    return pairs


def _add_norm_finding(ctx: AuditContext) -> Finding | None:
    pairs = find_add_norms(ctx.trace.ops)
    if not pairs:
        return None
    nbytes = (3 if ctx.train else 1) * sum(add.outputs[0].nbytes for add, _ in pairs)
    recs = [r for pair in pairs for r in pair]
    evidence = {
        "pattern": "add->LayerNorm",
        "sites": len(pairs),
        "intermediate_shape": list(pairs[0][0].outputs[0].shape),
        "dtype": pairs[0][0].outputs[0].dtype,
        "bytes_saved": nbytes,
        "modules": first_modules(norm.module for _, norm in pairs),
    }
    message = (
        f"a residual add then LayerNorm runs as 2 kernels at {len(pairs)} site(s): "
        f"AddLayerNorm writes and re-reads {nbytes / 1e6:,.1f} MB less a step"
    )
    return ctx.finding(
        RULE,
        module_pattern(norm.module for _, norm in pairs),
        message,
        evidence,
        saving_s=ctx.fusion_saving_s(recs, nbytes, "fused_norm_act"),
        fix="fuse-norm-act",
        replaces=recs,
    )


def _fused_family(ctx: AuditContext, norm: OpRecord) -> str:
    """The measured family whose rate prices the fused kernel of this chain."""
    if (
        norm.name in BATCH_NORM_OPS
        and "fused_batch_norm_act" in ctx.gpu.achievable.memory_efficiency
    ):
        return "fused_batch_norm_act"
    return "fused_norm_act"


_PARTS = frozenset({"convolution_backward", "threshold_backward", "avg_pool2d_backward"})


def handed_over_adds(ctx: AuditContext, chains: list[Chain]) -> list[OpRecord]:
    """The backward's adds the fused BatchNorm skips (kernels/batch_norm/_ops.py): each sums
    the gradient of a BatchNorm -> [add ->] ReLU chain's output from two users, a
    convolution's input gradient and the next block's residual (its ReLU's gradient) or its
    downsampling branch's (a convolution's, or an average pool's in a ResNet-D); fused, the
    norm's backward reads both
    parts (one more read) and the add (two reads, one write) is gone."""
    made = {
        t.storage: rec
        for rec in ctx.trace.ops
        if rec.phase == "backward"
        for t in rec.outputs[:1]
        if t.storage is not None
    }
    adds = []
    for chain in chains:
        if chain.norm.name not in BATCH_NORM_OPS or chain.ops[-1].name.rstrip("_") != "relu":
            continue
        for grad in ctx.backward_of(chain.ops[-1]):
            add = made.get(grad.inputs[0].storage) if grad.inputs else None
            if add is None or add.name != "add" or add.inplace or len(add.inputs) != 2:
                continue
            parts = [made.get(t.storage) for t in add.inputs]
            if all(p is not None and p.name in _PARTS for p in parts):
                adds.append(add)
    return adds


@register_rule(RULE, title="normalization then activation as separate kernels")
def check(ctx: AuditContext) -> Iterable[Finding]:
    add_norm = _add_norm_finding(ctx)
    if add_norm is not None:
        yield add_norm
    by_pattern: dict[str, list[Chain]] = {}
    for chain in filter(fusable, find_chains(ctx.trace.ops)):
        by_pattern.setdefault(chain.pattern, []).append(chain)
    passes = 4 if ctx.train else 2  # write + read, and the same for the gradient in training
    for pattern, chains in by_pattern.items():
        adds = handed_over_adds(ctx, chains) if ctx.train else []
        added = sum(a.outputs[0].nbytes for a in adds)  # each add: 3 such passes, 1 kept
        nbytes = passes * sum(c.intermediate_bytes for c in chains) + 2 * added
        evidence = {
            "pattern": pattern,
            "sites": len(chains),
            "intermediate_shape": list(chains[0].norm.outputs[0].shape),
            "dtype": chains[0].norm.outputs[0].dtype,
            "bytes_saved": nbytes,
            "modules": first_modules(c.norm.module for c in chains),
            "handed_over_adds": len(adds),
        }
        message = (
            f"{pattern} runs as {1 + len(chains[0].ops)} kernels at {len(chains)} "
            f"site(s): fusing writes and re-reads {nbytes / 1e6:,.1f} MB less a step"
        )
        if adds:
            message += (
                f" (with autograd's add of the gradient at {len(adds)} of their outputs, "
                "which the fused backward reads in two parts)"
            )
        if not ctx.train and chains[0].norm.name in BATCH_NORM_OPS:
            message += (
                " (for inference, folding the BatchNorm into the convolution before it "
                "and the rest into its epilogue removes these passes altogether)"
            )
        recs = [r for c in chains for r in (c.norm, *c.ops)] + adds
        saving = ctx.fusion_saving_s(recs, nbytes, _fused_family(ctx, chains[0].norm))
        yield ctx.finding(
            RULE,
            module_pattern(c.norm.module for c in chains),
            message,
            evidence,
            saving_s=saving,
            fix="fuse-norm-act",
            replaces=recs,
        )
