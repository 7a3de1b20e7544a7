"""What torch.compile does by itself to a training step, as compile mode prices it: the layout
Inductor picks for convolutions, the kernels it launches, the fixes it makes, and the GPU time
its fusion takes off the eager step (`compiled_gpu_saving_s`). auditing/modes.py builds the
compiled step from these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .context import AuditContext
from .finding import Finding
from .pricing.column_sum import column_sums, compiled_column_sum_saving_s
from .pricing.inductor_fusion import compiled_fusion_saving_s, has_storages
from .pricing.inductor_kernels import compiled_kernels_of
from .pricing.loss import compiled_loss_saving_s, loss_chain

# the fixes whose saving the fusion model (pricing/inductor_fusion.py) prices in compile mode
FUSED_FIXES = ("fuse-norm-act", "fuse-softmax-dropout", "fuse-activation")
COMPILE_DOES = {
    "pad-channels": "Inductor pads misaligned matmuls itself",  # (not convolutions)
    "fuse-norm-act": "Inductor fuses the normalization with the elementwise ops around it",
    "fuse-softmax-dropout": "Inductor fuses softmax and dropout into one kernel",
    "fuse-activation": "Inductor fuses a chain of elementwise ops into one kernel",
}


def inductor_layout_opt(trace: Any) -> tuple[bool, str]:
    """Whether Inductor runs a training step's convolutions channels_last by itself (its
    `layout_optimization`, on by default on CUDA), and why not where it does not: the rules of
    `torch._inductor.graph.GraphLowering.decide_layout_opt` for training graphs, applied to the
    traced forward. Measured on the H200 under torch.compile: MobileNetV3's channels_last
    rewrite changed its GPU time by 0.02 ms of 6.4, ResNet-50's by 0.7 of 36.5."""
    convs = [r for r in trace.ops if r.phase == "forward" and r.name == "convolution"]
    if not convs:
        return False, "no convolutions"
    if sum(r.phase == "forward" for r in trace.ops) >= 300 * len(convs):
        return False, "Inductor leaves the layout alone with so few convolutions among the ops"
    shapes = [tuple(r.inputs[1].shape) for r in convs if len(r.inputs) > 1]
    groups = [int(r.params.get("groups", 1) or 1) for r in convs]
    if any(g > 1 and w[1] > 1 for w, g in zip(shapes, groups)):
        return False, "a grouped convolution with more than one input channel per group"
    if any(len(w) > 2 and w[0] * 2 <= w[1] and w[2] > 1 for w in shapes):
        return False, "a convolution with fewer than half as many outputs as inputs"
    if all(w[0] <= 64 and w[1] <= 64 for w in shapes):
        return False, "every convolution has 64 channels or fewer"
    return True, "Inductor's layout optimization runs the convolutions channels_last itself"


def compiled_kernels(trace: Any, cost: Any) -> int:
    """The kernels of a compiled step as the host issues them: the extern kernels and what
    Inductor fuses between them (pricing/inductor_kernels.py), without cuDNN's NCHW <-> NHWC
    conversion kernels where Inductor runs the convolutions channels_last itself
    (`inductor_layout_opt`: its graph has none). MobileNetV3 on the H200, compiled: 731
    kernels a step as written and 731 with channels_last."""
    return compiled_kernels_of(trace, cost, inductor_layout_opt(trace)[0])


def inductor_does(f: Finding) -> bool:
    """Whether torch.compile makes this finding's fix by itself (so a compiled step runs
    without the time it saves)."""
    if not f.est_saving_s or f.est_saving_s <= 0:
        return False
    if f.fix in COMPILE_DOES and not about_convolution(f):
        return True
    return bool(f.evidence.get("compile_does"))


def compiled_gpu_saving_s(ctx: AuditContext, findings: Sequence[Finding] = ()) -> float:
    """What Inductor takes off the eager step's GPU time by itself: a cross-entropy's kernels
    over the logits fused (pricing/loss.py), bias gradients' column sums at its reductions'
    rate (pricing/column_sum.py), what the fixes it makes itself save (padding a misaligned
    GEMM, a normalization fused with its activation as the fix's kernel runs it; combine.py:
    overlapping fixes counted once), and the traffic between the other ops it fuses
    (pricing/inductor_fusion.py)."""
    from .combine import combine

    saving = compiled_loss_saving_s(ctx) + compiled_column_sum_saving_s(ctx)
    own = {r.index for r in loss_chain(ctx.trace)[0]} | set(column_sums(ctx.trace))
    does = [f for f in findings if inductor_does(f)]
    if has_storages(ctx.trace):
        # where a rule prices a fusion Inductor makes (a normalization and its activation at
        # the fused kernel's measured rate), its pricing; the dataflow elsewhere
        priced = [f for f in does if f.fix in FUSED_FIXES and f.replaces]
        for f in priced:
            own |= f.replaces
        saving += compiled_fusion_saving_s(ctx, exclude=own)
        does = [f for f in does if f.fix not in FUSED_FIXES or f in priced]
    if does:
        saving += combine(does, ctx)[1].saving_s
    return saving


def about_convolution(f: Finding) -> bool:
    """A finding about a convolution: Inductor pads matmuls, not the convolutions it hands to
    cuDNN, so padding channels still pays under torch.compile."""
    return "convolution" in str(f.evidence.get("op", ""))
