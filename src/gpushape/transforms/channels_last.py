"""channels-last: convolution weights in channels_last (NHWC) memory format.

With its weight in channels_last, a convolution's output comes out channels_last too (PyTorch
follows the weight's format when the input is NCHW), so the activations stay NHWC through the
network and cuDNN skips its NCHW <-> NHWC conversions; BatchNorm and pooling then run their
channels_last kernels. Inputs can stay NCHW (converting them too saves the first layer's one
conversion: `x.to(memory_format=torch.channels_last)`). Values, parameter objects and the
state_dict are unchanged: only strides change, so the optimizer's state stays valid.
"""

from __future__ import annotations

import torch
from torch import nn

from ._core import Change, Outcome, TransformContext, register_transform

ID = "channels-last"
CONVS = (nn.Conv2d, nn.ConvTranspose2d)


def _to_channels_last(t: torch.Tensor) -> bool:
    """Restride a 4-D tensor in place (same object); True when it changed."""
    if t.dim() != 4 or t.is_contiguous(memory_format=torch.channels_last):
        return False
    t.data = t.data.contiguous(memory_format=torch.channels_last)
    return True


def _restore(tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        t.data = t.data.contiguous()


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    for fqn, module in model.named_modules():
        if not isinstance(module, CONVS) or not ctx.allows(module, fqn):
            continue
        changed = [p for p in (module.weight,) if _to_channels_last(p)]
        if changed:
            out.changes.append(
                Change(
                    transform=ID,
                    module=fqn,
                    detail=f"weight {tuple(module.weight.shape)} to channels_last",
                    undo=lambda ts=changed: _restore(ts),
                )
            )
    return out
