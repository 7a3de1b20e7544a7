"""graph-layers' check and timing: the graphed model against itself run eagerly (the layers'
graphs bypassed), from the same random state, and a forward + backward timed both ways."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..bench.timer import time_fn

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


def _mismatch(a: torch.Tensor | None, b: torch.Tensor | None, floor: float = 0.0) -> str | None:
    """None when `a` equals the reference `b` within the check's tolerance, else by how much
    it misses."""
    if a is None or b is None:
        return None if a is None and b is None else "one of the two is None"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} against {tuple(b.shape)}"
    rtol = CHECK_RTOL.get(b.dtype, 2e-2)
    scale = max(b.float().abs().max().item(), floor)
    error = (a.float() - b.float()).abs().max().item()
    if error <= rtol * scale + 1e-12:
        return None
    return f"max error {error:.3g}, allowed {rtol:g} of its scale {scale:.3g}"


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
        miss = _mismatch(a, b)
        if miss:
            return f"output {i} {tuple(b.shape)} differs from the eager model's ({miss})"
    floor = FLOOR * max(
        (g.float().abs().max().item() for g in ref_grads if g is not None), default=0
    )
    for name, a, b in zip(names, grads, ref_grads):
        miss = _mismatch(a, b, floor)
        if miss:
            return f"the gradient of {name} differs from the eager model's ({miss})"
    return None


def layers_run(calls: list, samples: list, links: dict | None = None):
    """One forward and backward of the layers alone, each on its own sample inputs, or where
    `links` says so (`_graph_capture`: (layer, argument) -> (layer, output)) on an earlier
    layer's output, as the model feeds them: what graph-layers replaces (`calls`: the layers'
    positional adapters, eager or graphed). The outputs no layer reads get the gradients."""

    ones: dict = {}  # one gradient per output shape, made once: the timed passes run only
    # the layers' own kernels (a loss over ResNet's large activations would cost the GPU a
    # third as much again, both ways, and hide what replaying saves the host)
    links = links or {}
    read = set(links.values())

    def run():
        results, outs = [], []
        for i, (call, sample) in enumerate(zip(calls, samples)):
            args = list(sample)
            for k in range(len(args)):
                if (i, k) in links:
                    j, m = links[(i, k)]
                    args[k] = results[j][m]
            results.append(call(*args))
            outs += [
                t
                for m, t in enumerate(results[-1])
                if (i, m) not in read and t.is_floating_point() and t.requires_grad
            ]
        grads = []
        for t in outs:
            key = (t.shape, t.dtype, t.device)
            if key not in ones:
                ones[key] = torch.ones_like(t)
            grads.append(ones[key])
        torch.autograd.backward(outs, grads)
        for sample in samples:
            for t in sample:
                t.grad = None

    return run


def wall_seconds(run, block: int = 5) -> float:
    """Seconds per call of `run` (CUDA events, median of `block` calls after one warm-up)."""
    return time_fn(run, warmup=1, repeats=block, device="cuda").median_s
