"""fuse-grn: a global response norm (ConvNeXt-V2's GRN) becomes gpushape's GlobalResponseNorm,
the same function in 3 passes over the tensor forward and 5 backward (kernels/grn) instead of
PyTorch's dozen or so kernels a direction.

Matched by type: exactly timm's `timm.layers.grn.GlobalResponseNorm` and transformers'
`ConvNextV2GRN` (a subclass may change what it computes), wherever the model holds them. The
new module holds the very Parameters of the old one (Hugging Face's (1, 1, 1, C) shape kept),
so the state_dict, the optimizer's references and tied weights are untouched; undo puts the
original module back. The output differs from PyTorch's only by rounding: the kernels sum and
scale in float32 and round once, where a bf16 model's eager ops round after each step.
Refused: a module with hooks (they would no longer run). Under torch.compile Inductor fuses
the GRN's ops itself: the transform is not applied there.
"""

from __future__ import annotations

from torch import nn

from ..kernels import GlobalResponseNorm
from ._core import (
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    module_holders,
    register_transform,
    swap_module,
)

ID = "fuse-grn"
# (the module its class is defined in, its class name): the GRNs the kernels compute exactly
KNOWN = {
    ("timm.layers.grn", "GlobalResponseNorm"),
    ("transformers.models.convnextv2.modeling_convnextv2", "ConvNextV2GRN"),
}


def is_library_grn(module: nn.Module) -> bool:
    cls = type(module)
    return (cls.__module__, cls.__name__) in KNOWN


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    places = module_holders(model)
    seen: set[int] = set()
    for fqn, module in list(model.named_modules()):
        if not is_library_grn(module) or id(module) in seen or id(module) not in places:
            continue
        seen.add(id(module))
        if not ctx.allows(module, fqn):
            continue
        if has_hooks(module):
            reason = f"{type(module).__name__} has hooks, which the new module would not run"
            out.refusals.append(Refusal(transform=ID, module=fqn, reason=reason))
            continue
        try:
            new = GlobalResponseNorm.from_module(module)
        except TypeError as exc:
            out.refusals.append(Refusal(transform=ID, module=fqn, reason=str(exc)))
            continue
        detail = f"{type(module).__name__} -> gpushape {new!r}: 3 passes forward, 5 backward"
        out.changes.append(
            swap_module(module, new, places[id(module)], transform=ID, fqn=fqn, detail=detail)
        )
    return out
