"""s2d-stem: a strided convolution on fewer input channels than the tensor-core alignment (the
RGB stem of a CNN: ResNet's 7x7 stride-2 on 3 channels) becomes `SpaceToDepthConv2d`, the same
convolution computed at stride 1 over its input folded s x s into the channels
(models/space_to_depth.py says how and why it is exact).

cuDNN runs a 3-channel stem poorly: it pads the input to 8 channels on every call and runs an
older kernel, at about 7% of what its GEMMs would take aligned (the profile's `conv_small_cin`,
measured by `gpushape probe`). Folded, the stem reads 16 aligned channels with a 4x4 kernel:
on an H100, ResNet-50's stem at batch 256 took 2.22 ms forward and weight gradient against
2.99 (benchmarks/kernels/probe_stem.py), for 1.31x the multiply-adds.

Matched by type: exactly `torch.nn.Conv2d`, ungrouped, undilated, zero padding given as
numbers, an equal stride of 2 or more, a kernel larger than the stride (a patch embedding,
stride equal to the kernel, runs other kernels), fewer input channels than the alignment of
the target chip in the weight's dtype (and bf16's, as pad-channels counts it). Refused with
the reason: modules with hooks (they would no longer run) and the rest of the above. The new
module holds the convolution's own Parameters: state_dict keys, shapes and values, and an
optimizer made before, are unchanged; undo puts the original module back.
Under torch.compile Inductor calls cuDNN for the convolution as it is, so the fold pays there
too (on an H100 ResNet-50's compiled step went 44.41 -> 43.38 ms, its captured optimize step
38.91 -> 38.07: benchmarks/results/bench-h100/README.md). On 3x3 stride-2 stems the fold costs
about what the convolution gains (the slow-stem rule stays quiet there).
"""

from __future__ import annotations

import math

from torch import nn

from ..hardware.alignment import granularity, target_gpu
from ..models.space_to_depth import SpaceToDepthConv2d, why_not
from ._core import (
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    module_holders,
    register_transform,
    swap_module,
)

ID = "s2d-stem"


def alignment(conv: nn.Conv2d, gpu) -> int:
    """Channels the folded input is padded to a multiple of (see the module docstring)."""
    return math.lcm(granularity("conv", gpu, "bf16"), granularity("conv", gpu, conv.weight.dtype))


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    gpu = target_gpu(ctx.gpu)
    places = module_holders(model)
    seen: set[int] = set()
    for fqn, module in list(model.named_modules()):
        if not isinstance(module, nn.Conv2d) or id(module) in seen or id(module) not in places:
            continue
        seen.add(id(module))
        align = alignment(module, gpu)
        stride = module.stride[0] if isinstance(module.stride, tuple) else module.stride
        if module.in_channels >= align or stride < 2:
            continue  # not a slow stem: nothing to say
        if not ctx.allows(module, fqn):
            continue
        reason = why_not(module, align)
        if reason is None and has_hooks(module):
            reason = "Conv2d has hooks, which the new module would not run"
        if reason is not None:
            out.refusals.append(Refusal(transform=ID, module=fqn, reason=reason))
            continue
        new = SpaceToDepthConv2d(module, align)
        detail = f"{module!r} -> SpaceToDepthConv2d({new.extra_repr()})"
        out.changes.append(
            swap_module(module, new, places[id(module)], transform=ID, fqn=fqn, detail=detail)
        )
    return out
