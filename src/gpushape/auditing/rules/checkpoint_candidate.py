"""checkpoint-candidate: training memory dominated by repeated blocks that are cheap to recompute.

Activation checkpointing trades time for memory, so it is advice only when memory is short:
the rule speaks when the estimated training memory (activations kept for backward, weights,
gradients, optimizer state; pricing/memory.py) exceeds MEMORY_PRESSURE of the chip's memory, and
stays silent otherwise. Candidates are repeated blocks (children of a ModuleList/Sequential of
one type, as transformer layers and ResNet stages are): checkpointing them keeps only each
block's input and recomputes the rest in backward, at the cost of one more forward of the
blocks. Severity follows the share of activation memory freed (est_saving_s is null: the
saving is bytes, the price is time, both in the evidence). The part held by memory-bound ops
(norms, activations, dropout, softmax) is given apart: recomputing just those is cheapest.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..context import AuditContext
from ..finding import Finding
from ..pricing.memory import training_memory
from ..registry import register_rule

RULE = "checkpoint-candidate"
MEMORY_PRESSURE = 0.8  # of the chip's memory: the rest goes to workspace and fragmentation


def _kind(module: nn.Module) -> object:
    """A block's type; for a torch.fx rewrite (gpushape's fuse-norm-act makes one per block,
    each a class of its own) the class name it was given, the same for every such block."""
    if isinstance(module, torch.fx.GraphModule):
        return type(module).__name__
    return type(module)


def repeated_blocks(model: nn.Module) -> dict[str, list[str]]:
    """Container path -> paths of its children, where a container holds >= 2 of one type."""
    out = {}
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        types = {_kind(c) for _, c in children}
        if (
            len(children) >= 2
            and len(types) == 1
            and not isinstance(children[0][1], (nn.Linear, nn.ReLU, nn.GELU, nn.Dropout))
        ):
            out[path] = [f"{path}.{name}" if path else name for name, _ in children]
    return out


def _block_inputs_bytes(ctx: AuditContext, blocks: list[str]) -> int:
    wanted = set(blocks)
    return sum(c.input_bytes for c in ctx.observed.calls if c.module in wanted)


def _cheap_bytes(ctx: AuditContext, blocks: list[str]) -> tuple[int, float]:
    """Activation bytes kept by memory-bound ops inside the blocks, and their forward time."""
    prefixes = tuple(b + "." for b in blocks)
    nbytes, time_s = 0, 0.0
    for rec in ctx.forward_compute():
        if not (rec.module in blocks or rec.module.startswith(prefixes)):
            continue
        cost = ctx.op_cost(rec)
        if cost.bound == "memory" and not rec.inplace and ctx.backward_of(rec):
            nbytes += sum(t.nbytes for t in rec.outputs)
            time_s += cost.roofline_time_s
    return nbytes, time_s


@register_rule(RULE, title="activation memory that recomputation would free")
def check(ctx: AuditContext) -> Iterable[Finding]:
    if not ctx.train or ctx.model is None:
        return
    memory = training_memory(ctx)
    budget = ctx.gpu.memory_bytes * MEMORY_PRESSURE
    if memory.total_bytes <= budget or memory.activation_bytes == 0:
        return
    for container, blocks in repeated_blocks(ctx.model).items():
        kept = sum(memory.within(b) for b in blocks)
        largest = max(memory.within(b) for b in blocks)
        freed = kept - largest - _block_inputs_bytes(ctx, blocks)
        if freed <= 0:
            continue
        share = freed / memory.activation_bytes
        recompute_s = sum(
            ctx.cost.by_module(inclusive=True)[b].forward.roofline_time_s
            for b in blocks
            if b in ctx.cost.modules
        )
        cheap_bytes, cheap_s = _cheap_bytes(ctx, blocks)
        evidence = {
            "blocks": len(blocks),
            "activation_bytes": memory.activation_bytes,
            "freed_bytes": freed,
            "training_memory_bytes": memory.total_bytes,
            "gpu_memory_bytes": ctx.gpu.memory_bytes,
            "optimizer_state_bytes": memory.optimizer_state_bytes,
            "recompute_time_s": recompute_s,
            "memory_bound_bytes": cheap_bytes,
            "memory_bound_recompute_s": cheap_s,
        }
        message = (
            f"training needs ~{memory.total_bytes / 1e9:,.1f} GB of "
            f"{ctx.gpu.memory_bytes / 1e9:,.0f} GB; checkpointing the {len(blocks)} "
            f"blocks frees ~{freed / 1e9:,.1f} GB of activations for "
            f"{recompute_s * 1e3:,.2f} ms more a step ({cheap_bytes / 1e9:,.1f} GB of "
            f"it from memory-bound ops that recompute in {cheap_s * 1e3:,.2f} ms)"
        )
        yield ctx.memory_finding(
            RULE,
            f"{container}.*" if container else "*",
            message,
            evidence,
            share=share,
            fix="activation-checkpoint",
        )
