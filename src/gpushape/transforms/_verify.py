"""Is a rewritten model still the same function? The kernels' numeric gate, on a whole model.

For the example inputs and a random (seeded) gradient of the outputs, the outputs and the
gradient of every original parameter are compared three ways:

    max|rewritten - ref64| <= k * max|original - ref64| + tiny,   k = 2 (fp32), 3 (fp16/bf16)

where ref64 is the original model run in float64 and `original` the original in its own dtype:
a rewrite may be as far from exact as PyTorch itself is at that dtype, a little more, never
much more. Across a whole model a rewrite may also change the order of sums (another
convolution algorithm for another layout; a gradient that is pure cancellation, as a bias
before BatchNorm), so `tiny` is the kernels' backstop tolerance (1e-5 fp32, 1e-3 fp16, 2e-2
bf16) times the largest magnitude among the outputs, or among the gradients: far below what a
wrong rewrite (a lost activation, a residual added twice) changes. Models run on deep copies
with the same random seed, so running statistics, dropout's generator and the user's parameters
are left as they were. A padded parameter's gradient is compared on the original shape (the
leading slice).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils import _pytree as pytree

GATE_K = {torch.float64: 2.0, torch.float32: 2.0, torch.float16: 3.0, torch.bfloat16: 3.0}
BACKSTOP = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 2e-2}
SEED = 1234


@dataclass(frozen=True, kw_only=True)
class Verification:
    passed: bool
    checked: int
    """How many tensors were compared (outputs and parameter gradients)."""
    worst: str = ""
    """The comparison furthest over (or closest to) its bound, in one line."""
    errors: dict[str, float] = field(default_factory=dict, repr=False)


def _tensors(out) -> list[torch.Tensor]:
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        out = out.to_tuple()
    leaves = pytree.tree_leaves(out)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _run(model: nn.Module, inputs: tuple, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Outputs and parameter gradients of one seeded forward and backward, on a deep copy."""
    model = copy.deepcopy(model)
    if dtype is not None:
        model = model.to(dtype)
        inputs = pytree.tree_map(
            lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            inputs,
        )
    inputs = pytree.tree_map(
        lambda t: t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t,
        inputs,
    )
    torch.manual_seed(SEED)
    outs = _tensors(model(*inputs))
    gen = torch.Generator(device="cpu").manual_seed(SEED + 1)
    loss = sum(
        (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)).sum()
        for o in outs
    )
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    result = {f"output[{i}]": o.detach() for i, o in enumerate(outs)}
    for name, p in model.named_parameters():
        if p.grad is not None:
            result[f"grad {name}"] = p.grad.detach()
    return result


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a[tuple(slice(0, n) for n in ref.shape)] if a.shape != ref.shape else a
    diff = (a.double() - ref.double()).abs()
    finite = torch.isfinite(ref.double())
    return float(diff[finite].max()) if finite.any() else 0.0


def _magnitude(t: torch.Tensor) -> float:
    finite = t.double()[torch.isfinite(t.double())]
    return float(finite.abs().max()) if finite.numel() else 0.0


def reference(model: nn.Module, inputs: tuple) -> tuple[dict, dict, torch.dtype]:
    """(float64 results, same-dtype results, dtype) of the original model."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return _run(model, inputs, torch.float64), _run(model, inputs, None), dtype


def verify(model: nn.Module, inputs: tuple, ref: tuple[dict, dict, torch.dtype]) -> Verification:
    """Gate the rewritten `model` against the original's `reference(...)`."""
    ref64, same, dtype = ref
    ours = _run(model, inputs, None)
    k = GATE_K.get(dtype, 3.0)
    scale = {
        kind: max((_magnitude(t) for n, t in ref64.items() if n.startswith(kind)), default=1.0)
        for kind in ("output", "grad")
    }
    worst, worst_ratio, errors, ok = "", -1.0, {}, True
    for name, exact in ref64.items():
        if name not in same:
            continue
        if name not in ours:
            return Verification(passed=False, checked=len(errors), worst=f"{name} missing")
        tiny = BACKSTOP.get(dtype, 2e-2) * max(1.0, scale[name.split("[")[0].split(" ")[0]])
        bound = k * _err(same[name], exact) + tiny
        err = _err(ours[name], exact)
        errors[name] = err
        ratio = err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
        if ratio > worst_ratio:
            worst_ratio, worst = ratio, f"{name}: error {err:.3g} against a bound of {bound:.3g}"
        ok = ok and err <= bound
    return Verification(passed=ok, checked=len(errors), worst=worst, errors=errors)
