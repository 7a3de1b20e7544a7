"""One training step: forward, loss, backward, optimizer step, as users write it.

The optimizer is PyTorch's default construction unless asked otherwise (torch picks foreach
on CUDA), so that what `fused-optimizer` saves is measured, not assumed: SGD with momentum for
image models (their first input is a 4-D float batch), AdamW otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError
from .batch import Batch

OPTIMIZERS = ("auto", "sgd", "adamw", "adamw-fused")


def make_optimizer(model: nn.Module, batch: Batch, kind: str = "auto") -> torch.optim.Optimizer:
    """`kind`: sgd (lr 0.01, momentum 0.9), adamw (lr 1e-4), adamw-fused, or auto (sgd for
    image models, adamw for the rest)."""
    if kind not in OPTIMIZERS:
        raise GpushapeError(f"unknown optimizer {kind!r}; known: {', '.join(OPTIMIZERS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise GpushapeError("the model has no trainable parameters: nothing to train")
    if kind == "auto":
        x = batch.inputs[0] if batch.inputs else None
        image = isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 4
        kind = "sgd" if image else "adamw"
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-4, fused=True if kind == "adamw-fused" else None)


@dataclass
class TrainingStep:
    """`step()` runs one training step and returns the loss (a tensor: no host sync)."""

    model: nn.Module
    batch: Batch
    optimizer: torch.optim.Optimizer
    forward: Callable[..., Any] | None = None
    """What runs the forward: the model, or a compiled version of it."""
    caller_backward: bool = False
    """Run the backward on the calling thread (`torch.autograd.set_multithreading_enabled(False)`)
    rather than on autograd's per-device worker thread."""

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = self.model

    def loss(self) -> torch.Tensor:
        out = self.forward(*self.batch.inputs, **self.batch.kwargs)
        return self.batch.loss(out)

    def backward_and_update(self) -> torch.Tensor:
        """Forward, backward, optimizer step, with no zeroing (what a CUDA graph captures:
        gradients it allocates are overwritten by each replay)."""
        loss = self.loss()
        if self.caller_backward:
            with torch.autograd.set_multithreading_enabled(False):
                loss.backward()
        else:
            loss.backward()
        self.optimizer.step()
        return loss

    def __call__(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        return self.backward_and_update()


def build_step(
    model: nn.Module, batch: Batch, optimizer: str = "auto", forward: Callable | None = None
) -> TrainingStep:
    model.train()
    return TrainingStep(model, batch, make_optimizer(model, batch, optimizer), forward)
