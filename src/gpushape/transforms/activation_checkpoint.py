"""activation-checkpoint: recompute just enough in backward that activations fit a budget.

Given `memory_budget` (bytes of activations kept for backward; `optimize(memory_budget=...)`,
`gpushape optimize --memory-budget 20GB`), the plan is a knapsack over the trace: candidates are
the repeated blocks (transformer layers, ResNet stages' blocks) and each block's direct
children; checkpointing one frees the activations its ops keep (`pricing/memory.py`) less its
input, which the checkpoint keeps, and costs one more forward of it (the cost model's time).
Per block the options are: nothing, the whole block, or any set of its children; a dynamic
programme over the blocks picks the options that free enough at the least recompute time.
That beats checkpointing every block whenever less than everything must go: recomputing an
MLP's cheap activations before a whole attention block, or a few blocks only.

A chosen module's `forward` runs under `torch.utils.checkpoint.checkpoint(use_reentrant=False)`
(an attribute on the instance, removed on undo): parameters, the state_dict and the outputs are
unchanged, and dropout replays the same masks (the RNG state is restored for the recompute).
A chosen module whose forward is already replaced on the instance (autocast-bf16's wrapper) is
refused: the checkpoint runs the class's forward and would drop it. A wrapper on another module
(autocast around the whole model) is no obstacle: the recompute runs under the autocast state
the forward had.
Without a budget nothing is checkpointed (memory is not short: a finding would say so).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..auditing.context import AuditContext
from ..auditing.observe import observe
from ..auditing.pricing.memory import activations_by_module
from ..auditing.rules.checkpoint_candidate import repeated_blocks
from ..tracing.cost import cost
from ..tracing.tracer import trace
from ._core import Change, Outcome, Refusal, TransformContext, has_hooks, register_transform

ID = "activation-checkpoint"
BUCKETS = 1000  # resolution of the bytes to free in the knapsack
MAX_CHILDREN = 5  # children of a block considered one by one (the rest go with the block)
MARGIN = 0.03  # of the activations, freed beyond the budget: the per-module estimate's error
ATTEMPTS = 4  # plans tried, each tighter by what the last one's measured memory overshot


@dataclass(frozen=True)
class Candidate:
    module: str
    freed_bytes: int
    recompute_s: float


@dataclass(frozen=True)
class Plan:
    modules: tuple[str, ...]
    freed_bytes: int
    recompute_s: float
    activation_bytes: int
    need_bytes: int


def _context(model: nn.Module, ctx: TransformContext) -> AuditContext:
    with observe(model) as seen:
        traced = trace(model, ctx.example_inputs, train=True)
    return AuditContext(
        trace=traced, cost=cost(traced, ctx.gpu), gpu=ctx.gpu, model=model, observed=seen
    )


def _candidate(actx: AuditContext, kept: dict[str, int], path: str) -> Candidate:
    dotted = path + "."
    inside = sum(b for m, b in kept.items() if m == path or m.startswith(dotted))
    inputs = sum(c.input_bytes for c in actx.observed.calls if c.module == path)
    forward_s = sum(
        actx.op_cost(r).kernel_time_s
        for r in actx.forward_compute()
        if r.module == path or r.module.startswith(dotted)
    )
    return Candidate(path, max(inside - inputs, 0), forward_s)


def _options(actx: AuditContext, kept: dict[str, int], block: str) -> list[list[Candidate]]:
    """A block's choices: nothing, the whole block, or a set of its (largest) children."""
    whole = _candidate(actx, kept, block)
    module = actx.model.get_submodule(block)
    children = [_candidate(actx, kept, f"{block}.{n}") for n, _ in module.named_children()]
    children = sorted((c for c in children if c.freed_bytes > 0), key=lambda c: -c.freed_bytes)
    options = [[], [whole]]
    for k in range(1, min(len(children), MAX_CHILDREN) + 1):
        options += [list(combo) for combo in combinations(children[:MAX_CHILDREN], k)]
    return options


def plan(actx: AuditContext, budget_bytes: int) -> Plan | None:
    """The least-recompute set of modules whose checkpointing brings the activations kept for
    backward under `budget_bytes`; None when even every repeated block would not."""
    kept = activations_by_module(actx)
    total = sum(kept.values())
    need = total - budget_bytes + int(MARGIN * total)
    if total <= budget_bytes:
        return Plan((), 0, 0.0, total, 0)
    blocks = [b for paths in repeated_blocks(actx.model).values() for b in paths]
    unit = need / BUCKETS
    best: dict[int, tuple[float, list[Candidate]]] = {0: (0.0, [])}  # freed bucket -> plan
    for block in blocks:
        nxt = dict(best)
        for option in _options(actx, kept, block)[1:]:
            freed = sum(c.freed_bytes for c in option)
            extra = sum(c.recompute_s for c in option)
            for bucket, (time_s, chosen) in best.items():
                key = min(BUCKETS, bucket + int(freed / unit))
                if key not in nxt or time_s + extra < nxt[key][0]:
                    nxt[key] = (time_s + extra, chosen + option)
        best = nxt
    if BUCKETS not in best:
        return None
    time_s, chosen = best[BUCKETS]
    freed = sum(c.freed_bytes for c in chosen)
    return Plan(tuple(c.module for c in chosen), freed, time_s, total, need)


def _run_checkpointed(module: nn.Module, *args, **kwargs):
    """The module's class forward under a non-reentrant checkpoint. On meta tensors (gpushape's
    own trace, whose stand-in weights are gone by the backward) it runs plainly: an audit of a
    checkpointed model does not count the recompute, which the plan prices instead."""
    if any(isinstance(a, torch.Tensor) and a.is_meta for a in (*args, *kwargs.values())):
        return type(module).forward(module, *args, **kwargs)
    return checkpoint(type(module).forward, module, *args, use_reentrant=False, **kwargs)


def _is_checkpointed(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _run_checkpointed


def _checkpointed(module: nn.Module) -> Callable[[], None]:
    """Route `module`'s calls through a checkpoint; the undo. A partial over the module (not a
    closure over its bound method) so that a deep copy checkpoints the copy."""
    module.forward = functools.partial(_run_checkpointed, module)
    return lambda: module.__dict__.pop("forward", None)


def _real(model: nn.Module, ctx: TransformContext) -> bool:
    """Whether the model has real weights and inputs (it can be run, and its memory measured)."""
    return not any(p.is_meta for p in model.parameters()) and all(
        not t.is_meta for t in ctx.example_inputs if isinstance(t, torch.Tensor)
    )


def _kept(model: nn.Module, ctx: TransformContext) -> int:
    """What one forward of (a copy of) the model keeps for backward, measured."""
    return saved_bytes(copy.deepcopy(model).train(), ctx.example_inputs)


def _in_trace_units(model: nn.Module, ctx: TransformContext, actx: AuditContext) -> int:
    """The budget in the trace's estimate of activation bytes: where the model has real
    weights and inputs, scaled by what one forward actually keeps (`saved_bytes`; the estimate
    counts each op's outputs, autograd keeps what backward reads)."""
    if not _real(model, ctx):
        return ctx.memory_budget
    measured = _kept(model, ctx)
    estimated = sum(activations_by_module(actx).values())
    return int(ctx.memory_budget * estimated / measured) if measured else ctx.memory_budget


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    if ctx.memory_budget is None or not ctx.train:
        return out
    if any(_is_checkpointed(m) for m in model.modules()):
        return out  # checkpointed already: twice = once
    actx = _context(model, ctx)
    budget = _in_trace_units(model, ctx, actx)
    for _ in range(ATTEMPTS):
        chosen = plan(actx, budget)
        if chosen is None:
            for change in reversed(out.changes):
                change.undo()
            reason = "the budget cannot be met by recomputing the repeated blocks"
            return Outcome(refusals=[Refusal(transform=ID, module="", reason=reason)])
        for change in reversed(out.changes):  # the previous attempt's
            change.undo()
        out = _apply_plan(model, ctx, chosen)
        if not _real(model, ctx):
            return out
        kept = _kept(model, ctx)
        over = kept - ctx.memory_budget
        if over <= 0:
            return out
        # the estimate missed what the chosen modules free: plan again to free what this plan
        # did and the overshoot besides (in the trace's units)
        scale = budget / max(ctx.memory_budget, 1)
        budget = chosen.activation_bytes - chosen.freed_bytes - int(over * scale) - 1
    for change in reversed(out.changes):
        change.undo()
    reason = (
        f"after {ATTEMPTS} plans the step still keeps {kept / 1e9:,.3f} GB for backward "
        f"against the budget of {ctx.memory_budget / 1e9:,.3f} GB (measured)"
    )
    return Outcome(refusals=[Refusal(transform=ID, module="", reason=reason)])


def _apply_plan(model: nn.Module, ctx: TransformContext, chosen: Plan) -> Outcome:
    out = Outcome()
    for path in chosen.modules:
        module = model.get_submodule(path)
        if has_hooks(module) or not ctx.allows(module, path):
            out.refusals.append(Refusal(transform=ID, module=path, reason="hooks or filter_fn"))
            continue
        if "forward" in module.__dict__:
            reason = "its forward is replaced on the instance: the checkpoint would drop it"
            out.refusals.append(Refusal(transform=ID, module=path, reason=reason))
            continue
        detail = (
            f"recomputed in backward ({chosen.recompute_s * 1e3:,.3f} ms for all chosen; "
            f"activations {chosen.activation_bytes / 1e9:,.2f} -> "
            f"{(chosen.activation_bytes - chosen.freed_bytes) / 1e9:,.2f} GB predicted)"
        )
        out.changes.append(
            Change(transform=ID, module=path, detail=detail, undo=_checkpointed(module))
        )
    return out


def saved_bytes(model: nn.Module, inputs: tuple) -> int:
    """Activation bytes autograd keeps for backward in one forward of `model` (distinct
    storages, parameters left out), measured with saved-tensor hooks: what checkpointing
    reduces, on any device."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return sum(seen.values())
