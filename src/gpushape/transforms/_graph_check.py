"""graph-layers' check and timing: the graphed model against itself run eagerly (the layers'
graphs bypassed), from the same random state, and a forward + backward timed both ways."""

from __future__ import annotations

import statistics

import torch
from torch import nn
from torch.utils import _pytree as pytree

CHECK_RTOL = {torch.float32: 1e-4, torch.float64: 1e-8}  # else 2e-2 (16-bit floats)


class Bypass:
    """While on, every graphed layer runs its own forward (the check's and the timing's eager
    side)."""

    on = False


def _loss_and_grads(model: nn.Module, inputs: tuple, weights: list | None):
    """Outputs, parameter gradients of a fixed random projection of the outputs, and the
    projection's weights (made on the first call)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = model(*inputs)
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    outs = [t for t in outs if t.is_floating_point() and t.requires_grad]
    if weights is None:
        gen = torch.Generator(device=outs[0].device).manual_seed(0)
        weights = [
            torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32) for t in outs
        ]
    loss = sum((t.float() * w).sum() for t, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return (
        [t.detach().clone() for t in outs],
        [None if g is None else g.clone() for g in grads],
        weights,
    )


FLOOR = 1e-2  # a gradient near zero (BERT's key bias: softmax ignores it) is held to this
# fraction of the largest gradient's scale: it is rounding noise, summed in another order


def _close(a: torch.Tensor | None, b: torch.Tensor | None, floor: float = 0.0) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape:
        return False
    rtol = CHECK_RTOL.get(b.dtype, 2e-2)
    scale = max(b.float().abs().max().item(), floor)
    return (a.float() - b.float()).abs().max().item() <= rtol * scale + 1e-12


def self_check(model: nn.Module, inputs: tuple) -> str | None:
    """None when the graphed model's outputs and gradients equal the eager model's, both run from
    the same random state, else why not."""
    state = torch.cuda.get_rng_state()
    try:
        Bypass.on = True
        torch.cuda.manual_seed(1234)
        ref_out, ref_grads, weights = _loss_and_grads(model, inputs, None)
        Bypass.on = False
        torch.cuda.manual_seed(1234)
        out, grads, _ = _loss_and_grads(model, inputs, weights)
    except Exception as exc:
        return f"the graphed model failed to run: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        Bypass.on = False
        torch.cuda.set_rng_state(state)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for i, (a, b) in enumerate(zip(out, ref_out)):
        if not _close(a, b):
            return f"output {i} differs from the eager model's"
    floor = FLOOR * max(
        (g.float().abs().max().item() for g in ref_grads if g is not None), default=0
    )
    for name, a, b in zip(names, grads, ref_grads):
        if not _close(a, b, floor):
            return f"the gradient of {name} differs from the eager model's"
    return None


def measured_gain(model: nn.Module, inputs: tuple, rounds: int = 3, block: int = 5) -> tuple:
    """(eager seconds, graphed seconds): a forward and a backward of the model on `inputs` as a
    training step runs them (gradients set to None, then accumulated by backward), timed with
    CUDA events, blocks alternated between the graphs bypassed and replayed. The parameters'
    gradients are put back as they were."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    weights = None

    def step():
        nonlocal weights
        for p in params:
            p.grad = None
        out = model(*inputs)
        if hasattr(out, "to_tuple"):
            out = out.to_tuple()
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        outs = [t for t in outs if t.is_floating_point() and t.requires_grad]
        if weights is None:
            weights = [torch.randn_like(t, dtype=torch.float32) for t in outs]
        sum((t.float() * w).sum() for t, w in zip(outs, weights)).backward()

    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for bypass in (True, False, True, False):  # warm-up
            Bypass.on = bypass
            step()
        for _ in range(rounds):
            for bypass in (True, False):
                Bypass.on = bypass
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
                for _ in range(block):
                    step()
                end.record()
                end.synchronize()
                times[bypass].append(start.elapsed_time(end) / 1e3 / block)
    finally:
        Bypass.on = False
        for p, g in zip(params, saved):
            p.grad = g
    return statistics.median(times[True]), statistics.median(times[False])
