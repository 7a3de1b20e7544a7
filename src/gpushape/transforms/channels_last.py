"""channels-last: convolution weights, and the model's 4-D inputs, in channels_last (NHWC).

With its weight in channels_last, a convolution's output comes out channels_last too (PyTorch
follows the weight's format when the input is NCHW), so the activations stay NHWC through the
network and cuDNN skips its NCHW <-> NHWC conversions; BatchNorm and pooling then run their
channels_last kernels. The inputs are converted too, by a forward pre-hook on the model that
restrides 4-D floating-point arguments (on the H200 a ResNet-50 step fed NCHW images ran 12 %
slower than fed channels_last ones: benchmarks/results/optimize-h200/). Values, parameter
objects and the state_dict are unchanged: only strides change, so the optimizer's state stays
valid. Undo restores the weights' strides and removes the hook.
"""

from __future__ import annotations

import torch
from torch import nn

from ._core import Change, Outcome, TransformContext, register_transform

ID = "channels-last"
CONVS = (nn.Conv2d, nn.ConvTranspose2d)


def _to_channels_last(t: torch.Tensor) -> tuple[int, ...] | None:
    """Restride a 4-D tensor in place (same object) to channels_last's own strides; its old
    strides when it changed, else None. A 1x1 weight (C_out, C_in, 1, 1) with strides
    (C_in, 1, 1, 1) is contiguous both ways, and PyTorch then runs its convolution NCHW
    (MobileNetV3's squeeze-excite convolutions, on pooled N x C x 1 x 1 inputs): it gets
    (C_in, 1, C_in, C_in), as `model.to(memory_format=torch.channels_last)` gives it."""
    if t.dim() != 4:
        return None
    new = torch.empty_like(t.data, memory_format=torch.channels_last)
    if new.stride() == t.stride():
        return None
    old = t.stride()
    t.data = new.copy_(t.data)
    return old


def _restore(tensors: list[tuple[torch.Tensor, tuple[int, ...]]]) -> None:
    """Each tensor back to the strides it had."""
    for t, stride in tensors:
        t.data = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t.data)


def _channels_last_inputs(module: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook: 4-D floating-point tensor arguments restrided to channels_last."""

    def convert(value):
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value

    return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}


def _hooked(model: nn.Module) -> bool:
    return any(
        getattr(h, "__name__", "") == _channels_last_inputs.__name__
        for h in model._forward_pre_hooks.values()
    )


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    for fqn, module in model.named_modules():
        if not isinstance(module, CONVS) or not ctx.allows(module, fqn):
            continue
        old = _to_channels_last(module.weight)
        if old is not None:
            changed = [(module.weight, old)]
            out.changes.append(
                Change(
                    transform=ID,
                    module=fqn,
                    detail=f"weight {tuple(module.weight.shape)} to channels_last",
                    undo=lambda ts=changed: _restore(ts),
                )
            )
    if out.changes and not _hooked(model):
        handle = model.register_forward_pre_hook(_channels_last_inputs, with_kwargs=True)
        out.changes.append(
            Change(
                transform=ID,
                module="",
                detail="4-D floating-point inputs to channels_last (a forward pre-hook)",
                undo=handle.remove,
            )
        )
    return out
