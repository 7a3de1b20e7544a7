"""fuse-activation: an activation module written as an elementwise formula becomes PyTorch's
one-kernel module computing the same function.

Matched by what the module computes, not by its name: a module with no parameters, buffers or
children, that is not already one of torch.nn's own, whose output on a probe of values across
the activation's range (float32, on the CPU) equals one of CANDIDATES' within PROBE_TOL is
replaced by that candidate (`nn.GELU(approximate="tanh")` for Hugging Face's
NewGELUActivation / gelu_new and FastGELUActivation, `nn.GELU()` for the erf formula, `nn.SiLU()`
for x * sigmoid(x)), wherever the model holds it. A library that changes what its module
computes no longer matches, and nothing is rewritten. The fused function computes in fp32
inside, so in bf16 it lands closer to the exact value than the chain of rounded steps did.
Refused: a module with hooks (they would no longer run). Under torch.compile it saves nothing
(Inductor fuses the chain itself). Parameters and the state_dict are untouched; undo puts the
original module back.
"""

from __future__ import annotations

import torch
from torch import nn

from ._core import (
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    module_holders,
    register_transform,
    swap_module,
)

ID = "fuse-activation"
PROBE_TOL = 1e-5
CANDIDATES = (
    ("nn.GELU(approximate='tanh')", lambda: nn.GELU(approximate="tanh")),
    ("nn.GELU()", nn.GELU),
    ("nn.SiLU()", nn.SiLU),
)


def _probe() -> torch.Tensor:
    return torch.linspace(-8.0, 8.0, 4097, dtype=torch.float32)


def _stateless(module: nn.Module) -> bool:
    return not (module._parameters or module._buffers or module._modules)


def match(module: nn.Module) -> tuple[str, nn.Module] | None:
    """(name, a new module) of the one-kernel function `module` computes, or None."""
    if not _stateless(module) or type(module).__module__.startswith("torch."):
        return None
    x = _probe()
    try:
        with torch.no_grad():
            y = module(x)
    except Exception:  # needs other arguments, another dtype or device: not an activation
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or not y.is_floating_point():
        return None
    for name, make in CANDIDATES:
        candidate = make()
        with torch.no_grad():
            if torch.allclose(y.float(), candidate(x), atol=PROBE_TOL, rtol=PROBE_TOL):
                return name, candidate
    return None


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    places = module_holders(model)
    seen: set[int] = set()
    for fqn, module in list(model.named_modules()):
        if id(module) in seen or id(module) not in places or not ctx.allows(module, fqn):
            continue
        seen.add(id(module))
        found = match(module)
        if found is None:
            continue
        if has_hooks(module):
            reason = f"{type(module).__name__} has hooks, which the new module would not run"
            out.refusals.append(Refusal(transform=ID, module=fqn, reason=reason))
            continue
        detail = f"{type(module).__name__} -> {found[0]}: the same function in one kernel"
        change = swap_module(
            module, found[1], places[id(module)], transform=ID, fqn=fqn, detail=detail
        )
        out.changes.append(change)
    return out
