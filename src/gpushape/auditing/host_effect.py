"""What a fix does to the host's side of an eager step.

A fusion changes what Python dispatches as well as what the GPU runs: SDPA issues one op
where hand-written attention issued six, and gpushape's fused BatchNorm kernels cost the host
more per call than PyTorch's batch_norm and activation together (measured on the H200's host:
EfficientNet-B0's eager step went 31.4 ms channels-last to 40.9 ms with them, its GPU busy
13.7 -> 11.9 ms). Where the host sets the pace, that difference is the fix's wall-clock effect.

    host saving = the replaced ops (forward and backward) at their classes' host rates
                  - sites x what the fix dispatches instead, at its class's rates

`INSTEAD` says what each fix dispatches per site (the host class of tracing/host.py, ops
forward, ops backward, as the trace of the rewritten module records them); a fix not in it
(padding, a layout, a smaller head) dispatches the same ops and saves no host time. Sites are
the finding's `evidence["sites"]`, else the modules its forward ops ran in. Views and module
calls are left as they were. `fused-optimizer` saves what a foreach step's Python costs beyond
the fused step (tracing/optimizer_step.py). `EXTRA` says what a fix that keeps the ops adds
per site (negative saving). 0.0 where the profile measured no host rates.
"""

from __future__ import annotations

from ..tracing.optimizer_step import foreach_host_s
from .context import AuditContext
from .finding import Finding

# fix -> (host class, forward ops, backward ops) a site dispatches once rewritten
INSTEAD = {
    "sdpa": ("attention", 1, 1),  # F.scaled_dot_product_attention
    "fuse-qkv": ("gemm", 1, 1),  # one GEMM for the three projections
    "fuse-activation": ("op", 1, 1),  # the activation as one function (F.gelu)
    "fuse-softmax-dropout": ("gpushape", 1, 1),
    "no-kv-cache": ("op", 0, 0),  # the cache's copies are gone, nothing instead
    "fast-max-pool": ("gpushape", 1, 1),  # gpushape.max_pool2d and its backward
    "fuse-grn": ("gpushape", 1, 1),  # gpushape.global_response_norm and its backward
    "fuse-group-norm": ("gpushape_group_norm", 1, 1),  # gpushape.group_norm_act, its backward
}
# fix -> (host class, forward ops, backward ops) a site dispatches on top of the ops it keeps:
# s2d-stem keeps the convolution and adds the folds (input: pad, pixel_unshuffle, pad;
# weight: pad, its permuted copy, pad, a channels_last copy; backward: the weight's unfold)
EXTRA = {"s2d-stem": ("op", 7, 3)}
# fuse-norm-act by its norm: gpushape's BatchNormAct2d traces as 2 forward ops (statistics,
# apply) and 1 backward; its row norms (AddLayerNorm, LayerNormGELU, RMSNorm) as 1 and 1
NORM_ACT = {"batch_norm": ("gpushape", 2, 1), "layer_norm": ("gpushape_norm", 1, 1)}


def host_saving_s(f: Finding, ctx: AuditContext) -> float:
    """Seconds of host dispatch the fix takes off an eager step (negative: it adds them)."""
    from ..tracing.host import KEYS, op_class, ops_seconds, rate

    rates = getattr(ctx.gpu.achievable, "host", None) or {}
    if f.fix == "fused-optimizer":  # the foreach step's Python, per parameter tensor
        return foreach_host_s(ctx.optimizer, rates)
    if not f.replaces or not all(k in rates for k in KEYS):
        return 0.0
    if f.fix in EXTRA:
        cls, forward, backward = EXTRA[f.fix]
        per_site = forward * rate(rates, cls, False) + (
            backward * rate(rates, cls, True) if ctx.train else 0.0
        )
        return -_sites(f, [ctx.trace.ops[i] for i in sorted(f.replaces)]) * per_site
    ops = [ctx.trace.ops[i] for i in sorted(f.replaces)]
    instead = _instead(f, ops, op_class)
    if instead is None:
        return 0.0
    before = ops_seconds(ops, rates)
    cls, forward, backward = instead
    per_site = forward * rate(rates, cls, False)
    if ctx.train:
        per_site += backward * rate(rates, cls, True)
    return before - _sites(f, ops) * per_site


def _instead(f: Finding, ops, op_class) -> tuple[str, int, int] | None:
    if f.fix == "fuse-norm-act":
        classes = {op_class(r.op) for r in ops if r.phase == "forward"}
        return NORM_ACT["batch_norm" if "batch_norm" in classes else "layer_norm"]
    return INSTEAD.get(f.fix or "")


def _sites(f: Finding, ops) -> int:
    sites = f.evidence.get("sites")
    if isinstance(sites, int) and sites > 0:
        return sites
    return len({r.module for r in ops if r.phase == "forward"}) or 1
