"""`module_glue`: what one module call costs the host beyond the ops it dispatches.

The host model (tracing/host.py) prices a step's ops, views and module calls at rates measured
on chains of bare calls (probe/host.py). A real module's forward runs Python between its ops
(attribute lookups, shape arithmetic, a library's argument handling and mask building), which
no chain of bare calls has: on the H200's host the forwards of Hugging Face and timm models
issued 1.3-2.1x slower than their ops and bare module calls predicted. This module measures
that glue on real models and fits one rate per module call:

    module_glue = sum over models of (measured forward - predicted forward ops and views)
                  / sum over models of the module calls their traces saw

each model's forward (with a loss, the mean of its output: the step's Python around the model)
issued eagerly at a small batch in bf16, synchronised before so it never waits on the GPU,
median of `repeats`.
The models: the library ones that import (Hugging Face's and timm's, built from their
configurations with random weights), else gpushape's own zoo. The fit pools the models (one
rate, not one per library); `per_model` keeps each model's own figure, whose range says how
far one rate is from any one model.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..bench.timer import hold_gpu

MODELS = (
    "timm:resnet50",
    "hf:gpt2",
    "timm:vit_base_patch16_224",
    "timm:efficientnet_b0",
    "hf:bert",
)
QUICK_MODELS = ("timm:resnet50", "hf:gpt2")
ZOO_MODELS = ("resnet50", "gpt2")  # where neither library imports


@dataclass(frozen=True)
class GlueSample:
    """One model: its forward's measured issue seconds, the ops and views' predicted seconds,
    and the module calls its trace saw."""

    model: str
    forward_s: float
    ops_s: float
    modules: int

    @property
    def per_module_s(self) -> float:
        return max(self.forward_s - self.ops_s, 0.0) / max(self.modules, 1)


def plain_loss(out: Any) -> torch.Tensor:
    """A scalar from a model's output: the mean of its first floating tensor (a library
    model's logits), the step's Python around the model without a task's labels."""
    for t in pytree.tree_leaves(out.to_tuple() if hasattr(out, "to_tuple") else out):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t.float().mean()
    raise ValueError("the model returned no floating tensor that needs a gradient")


def issue_seconds(
    model: torch.nn.Module,
    inputs: tuple,
    repeats: int,
    *,
    kwargs: dict | None = None,
    loss: Callable[[Any], torch.Tensor] = plain_loss,
    hold_s: float = 0.0,
) -> tuple[float, float]:
    """(median seconds to issue the forward with its loss, median seconds to issue the
    backward), the device synchronised before each so neither waits on it. `hold_s`: on a GPU,
    a kernel queued first keeps it busy that long (`bench.timer.hold_gpu`), so that a batch
    whose kernels outlast their issue cannot make the host wait mid-way; a pass that still
    took as long as the hold waited on it, and its median is NaN."""
    cuda = any(p.is_cuda for p in model.parameters())
    kwargs = kwargs or {}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        if cuda and hold_s > 0:
            hold_gpu(hold_s)

    fwd, bwd = [], []
    for i in range(repeats + 3):
        for p in model.parameters():
            p.grad = None
        sync()
        t0 = time.perf_counter()
        value = loss(model(*inputs, **kwargs))
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        value.backward()
        t3 = time.perf_counter()
        sync()
        if i >= 3:  # warm-up: first calls, library heuristics
            fwd.append(t1 - t0)
            bwd.append(t3 - t2)
    if cuda:
        torch.cuda.synchronize()

    def median(times: list[float]) -> float:
        waited = hold_s > 0 and max(times) >= 0.9 * hold_s
        return math.nan if waited else statistics.median(times)

    return median(fwd), median(bwd)


def predicted_sample(spec: str, forward_s: float, rates: dict[str, float], batch: int = 2):
    """A `GlueSample` for `spec` measured at `forward_s`: its meta trace priced at `rates`."""
    from ..models import resolve_model
    from ..tracing import trace as trace_model
    from ..tracing.host import forward_seconds, module_calls

    meta = resolve_model(spec, batch=batch, dtype=torch.bfloat16, device="meta")
    trace = trace_model(meta.model, meta.example_inputs, train=True)
    ops = forward_seconds(trace, rates, glue=False)
    return GlueSample(spec, forward_s, ops, module_calls(trace))


def measure_sample(
    spec: str, rates: dict[str, float], device: str = "cuda", batch: int = 2, repeats: int = 10
) -> GlueSample:
    """Build `spec` on `device` (bf16, random weights), time its forward, price its trace."""
    from ..models import resolve_model

    real = resolve_model(spec, batch=batch, dtype=torch.bfloat16, device=device)
    real.model.train()
    forward_s, _ = issue_seconds(real.model, tuple(real.example_inputs), repeats)
    del real
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return predicted_sample(spec, forward_s, rates, batch)


def fit(samples: list[GlueSample]) -> dict[str, Any] | None:
    """The pooled rate and each model's own, as a profile's host entry; None without samples."""
    if not samples:
        return None
    excess = sum(max(s.forward_s - s.ops_s, 0.0) for s in samples)
    modules = sum(s.modules for s in samples)
    return {
        "seconds": excess / max(modules, 1),
        "workload": "a module call's Python beyond its ops, fitted on eager forwards of "
        + ", ".join(s.model for s in samples),
        "calls": modules,
        "per_model": {s.model: s.per_module_s for s in samples},
    }


def _available(specs) -> list[str]:
    """The specs whose library imports here, else gpushape's zoo models."""
    from ..models.library import library_missing

    return [s for s in specs if library_missing(s) is None] or list(ZOO_MODELS)


def measure_glue(
    device: str, rates: dict[str, float], *, quick: bool = False, repeats: int = 10
) -> dict[str, Any] | None:
    """`fit` over the models that build here (a model that fails is left out); None on a
    device other than CUDA (the CPU's forwards are the ops themselves, not the host's
    dispatch)."""
    if torch.device(device).type != "cuda":
        return None
    samples = []
    for spec in _available(QUICK_MODELS if quick else MODELS):
        try:
            samples.append(measure_sample(spec, rates, device, repeats=repeats))
        except Exception:  # a model that does not build or run here leaves the others
            continue
    return fit(samples)
