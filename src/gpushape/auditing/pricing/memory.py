"""Training memory, estimated from the trace: activations kept for backward, weights, gradients
and optimizer state.

Activations: every forward op that autograd records (it has backward ops) and that allocates
(not in place) is counted as keeping its outputs until backward. That counts a tensor once
whether its producer or its consumer saves it, and overcounts the few outputs nobody saves
(a dropout output that only feeds an add): it is an upper estimate, as the cost model's
minimum bytes are a lower one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..context import AuditContext


@dataclass(frozen=True)
class TrainingMemory:
    activations: dict[str, int]  # module path -> bytes kept for backward
    weights_bytes: int
    grads_bytes: int
    optimizer_state_bytes: int | None  # None: no optimizer given

    @property
    def activation_bytes(self) -> int:
        return sum(self.activations.values())

    @property
    def total_bytes(self) -> int:
        return (
            self.activation_bytes
            + self.weights_bytes
            + self.grads_bytes
            + (self.optimizer_state_bytes or 0)
        )

    def within(self, prefix: str) -> int:
        """Activation bytes of a module and its submodules."""
        dotted = prefix + "."
        return sum(b for m, b in self.activations.items() if m == prefix or m.startswith(dotted))


def activations_by_module(ctx: AuditContext) -> dict[str, int]:
    kept: dict[str, int] = {}
    for rec in ctx.forward_compute():
        if rec.inplace or not ctx.backward_of(rec):
            continue
        kept[rec.module] = kept.get(rec.module, 0) + sum(t.nbytes for t in rec.outputs)
    return kept


def _optimizer_state_bytes(optimizer) -> int | None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    from ...tracing.optimizer_step import state_bytes

    try:
        return state_bytes(optimizer)
    except Exception:  # an optimizer that needs real values: state unknown
        return None


def training_memory(ctx: AuditContext) -> TrainingMemory:
    params = list(ctx.model.parameters()) if ctx.model is not None else []
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return TrainingMemory(
        activations_by_module(ctx), weights, grads, _optimizer_state_bytes(ctx.optimizer)
    )
