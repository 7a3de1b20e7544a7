"""safe-avg-pool: a correctness guard, not a speed fix. `nn.AvgPool2d` with padding becomes
gpushape's `LayoutSafeAvgPool2d`, whose input gradient for a channels_last CUDA tensor comes
from PyTorch's NCHW backward where PyTorch's NHWC one is wrong (pytorch/pytorch#188344, a fix
proposed in #188345; kernels/pooling/avg_pool.py).

The NHWC kernel drops the padding offset, so a padded pool that sees channels_last tensors gets
wrong input gradients: on an H100 (torch 2.11) PoolFormerV2-S12's stage-3 norms received
gradients 190-310 % (relative L2) off once fuse-group-norm's GroupNormAct kept its outputs
channels_last, and channels-last does the same to any model with such a pool (PoolFormer,
PoolFormerV2). `optimize` therefore applies it without being asked, before any other transform
and never rolled back for speed, wherever `avg_pool_nhwc_backward_ok` finds the bug on the
model's device and the model holds such a pool (`needed`); by name it applies anywhere.

Matched by type: exactly `nn.AvgPool2d` with padding > 0, wherever the model holds it. Refused:
one with padding 0 (PyTorch's NHWC backward is right there), a subclass (it may compute
something else: it stays exposed), hooks on the module. No parameters or buffers: the
state_dict is untouched; the new module is an `nn.AvgPool2d` too; undo puts the original back.
Outputs are PyTorch's, op for op; off CUDA, or on a PyTorch without the bug, so is everything.
Under torch.compile the module is `nn.AvgPool2d`: Inductor (torch 2.14) writes its own backward
for up to 25 windows over an input pixel (PoolFormer's 3x3 at stride 1: 9) and calls
PyTorch's kernel, unguarded, beyond that (a 7x7 window at stride 1). `F.avg_pool2d` called in a
forward is not a module: not guarded either.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from ..kernels import LayoutSafeAvgPool2d
from ..kernels.pooling.avg_pool import avg_pool_nhwc_backward_ok
from ._core import Outcome, Refusal, TransformContext, register_transform, swap_each

ID = "safe-avg-pool"
ISSUE = "pytorch#188344"


def _padded(module: nn.Module) -> bool:
    return any(p > 0 for p in _pair(module.padding))


def _candidate(module: nn.Module) -> bool:
    return isinstance(module, nn.AvgPool2d) and not isinstance(module, LayoutSafeAvgPool2d)


def _build(module: nn.Module) -> tuple[nn.Module, str]:
    if type(module) is not nn.AvgPool2d:
        raise TypeError(
            f"{type(module).__name__} subclasses nn.AvgPool2d and may compute something else: "
            f"left as it is, its channels_last gradient exposed to {ISSUE}"
        )
    new = LayoutSafeAvgPool2d.from_module(module)
    detail = (
        f"{module!r} -> gpushape LayoutSafeAvgPool2d: a channels_last input's gradient taken "
        f"by PyTorch's NCHW backward where its NHWC one drops the padding ({ISSUE})"
    )
    return new, detail


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = swap_each(model, ctx, ID, lambda m: _candidate(m) and _padded(m), _build)
    seen: set[int] = set()
    for fqn, module in model.named_modules():
        if _candidate(module) and not _padded(module) and id(module) not in seen:
            seen.add(id(module))
            if ctx.allows(module, fqn):
                reason = f"padding 0: PyTorch's channels_last backward is right there ({ISSUE})"
                out.refusals.append(Refusal(transform=ID, module=fqn, reason=reason))
    return out


def needed(model: nn.Module, inputs: tuple = ()) -> bool:
    """Whether optimize must apply the guard unasked: the model holds an `nn.AvgPool2d` with
    padding (not yet guarded) and PyTorch's NHWC backward is wrong on the model's device
    (measured: `avg_pool_nhwc_backward_ok`)."""
    if not any(_candidate(m) and _padded(m) for m in model.modules()):
        return False
    return not avg_pool_nhwc_backward_ok(_device(model, inputs))


def _device(model: nn.Module, inputs: tuple) -> torch.device:
    """The device of the model's first parameter or buffer, else of its first input tensor."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    leaves = torch.utils._pytree.tree_leaves(inputs)
    return next((t.device for t in leaves if isinstance(t, torch.Tensor)), torch.device("cpu"))
