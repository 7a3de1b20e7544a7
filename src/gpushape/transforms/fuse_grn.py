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
from ..models.library import is_library_grn
from ._core import Outcome, TransformContext, register_transform, swap_each

ID = "fuse-grn"


def _build(module: nn.Module) -> tuple[nn.Module, str]:
    new = GlobalResponseNorm.from_module(module)
    return new, f"{type(module).__name__} -> gpushape {new!r}: 3 passes forward, 5 backward"


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    return swap_each(model, ctx, ID, is_library_grn, _build)
