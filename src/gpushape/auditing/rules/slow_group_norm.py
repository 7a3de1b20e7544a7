"""slow-group-norm: group norms through PyTorch's kernels, which leave most of the GPU idle.

PyTorch's eager GroupNorm takes each (sample, group)'s statistics in one thread block: a
one-group norm at batch 64 (PoolFormer's) runs 64 blocks, on 132 SMs, and the backward adds
three kernels more. On an H100 the probe measured the pair at 0.13 of the copy rate for one
group and 0.20 for 32 (families `group_norm` and `group_norm@2048`); in ResNet-50-GN's eager
training step the group norms took 11.5 of 25.3 ms of kernel time. gpushape's GroupNormAct
splits every reduction over the pixels until the SMs are full, and runs an activation that
reads the norm's output in its own elementwise pass (kernels/group_norm).

Fires on the forward group-norm ops of modules fuse-group-norm takes (nn.GroupNorm, timm's
GroupNorm, GroupNorm1, GroupNorm1NoBias, GroupNormAct and GroupNorm1Act, by class where the
model is at hand; a look-alike or subclass gets a finding without a fix). Saving: those ops and
their backward, and where the next op is a ReLU, SiLU, GELU or Hardswish that is the only reader
of the norm's output (clones of an in-place one between) those too, as the cost model prices
them, less gpushape's kernels moving 3 S forward and 5 S backward (S: x's bytes; 3 S in
inference) at the rate measured for them (`fused_group_norm`; the copy rate where the profile
has not measured it), in eager and graph mode. Under torch.compile Inductor writes its own
group-norm kernels, and the profile has no rate for them: the finding is info there. **Fix:**
`fuse-group-norm`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...models.library import is_library_group_norm
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import module_pattern
from ..registry import register_rule
from .unfused_norm_act import find_chains

RULE = "slow-group-norm"
FAMILY = "fused_group_norm"
OP = "native_group_norm"
FORWARD_PASSES, BACKWARD_PASSES = 3, 5  # over x's bytes: gpushape's kernels
ACTS = frozenset({"relu", "silu", "gelu", "hardswish"})  # what GroupNormAct folds in
GROUP_NORM_TYPES = frozenset(
    {"GroupNorm", "GroupNorm1", "GroupNorm1NoBias", "GroupNormAct", "GroupNorm1Act"}
)
QUIET = {
    "compile": "under torch.compile Inductor writes its own group-norm kernels, and the "
    "profile has no rate measured for them",
}


def _takes(ctx: AuditContext, rec: OpRecord) -> bool | None:
    """True: fuse-group-norm takes this norm; False: a look-alike it leaves; None: not a group
    norm GroupNormAct computes (another type, or a dtype the kernels lack)."""
    if rec.module_type not in GROUP_NORM_TYPES or not rec.inputs:
        return None
    if str(rec.inputs[0].dtype) not in ("float32", "float16", "bfloat16"):
        return None
    if ctx.model is None:
        return True
    try:
        module = ctx.model.get_submodule(rec.module)
    except AttributeError:
        return True
    return is_library_group_norm(module) or is_library_group_norm(module, with_act=True)


def _other_readers(ctx: AuditContext, norm: OpRecord, ops: list[OpRecord]) -> bool:
    """Whether a forward op besides the chain's reads the norm's output: anywhere, or, where
    the activation runs in place (its output is the same memory), before it."""
    out = norm.outputs[0].storage
    if out is None:
        return False
    trace = ctx.trace.ops
    where = {id(r): i for i, r in enumerate(trace)}
    start, act = where[id(norm)], where[id(ops[-1])]
    end = act if ops[-1].name.endswith("_") else len(trace)
    chain = {id(r) for r in ops}
    return any(
        r.phase == "forward"
        and r.kind == "compute"
        and id(r) not in chain
        and any(t.storage == out for t in r.inputs)
        for r in trace[start + 1 : end]
    )


def _activations(ctx: AuditContext, norms: list[OpRecord]) -> dict[int, list[OpRecord]]:
    """id(norm) -> the ops after it that GroupNormAct folds in (clones, then the activation),
    where they are the norm's output's only reader (else fuse-group-norm leaves them)."""
    ids = {id(r) for r in norms}
    found = {}
    for chain in find_chains(ctx.trace.ops):
        if id(chain.norm) not in ids or chain.ops[-1].name.rstrip("_") not in ACTS:
            continue
        ops = list(chain.ops)
        if all(op.name == "clone" for op in ops[:-1]) and not _other_readers(ctx, chain.norm, ops):
            found[id(chain.norm)] = ops
    return found


def kernel_bytes(rec: OpRecord, train: bool) -> int:
    """gpushape's kernels' bytes for one group norm, forward and (training) backward."""
    passes = FORWARD_PASSES + (BACKWARD_PASSES if train else 0)
    return passes * rec.inputs[0].nbytes


@register_rule(RULE, title="group norms through PyTorch's kernels, which leave SMs idle")
def check(ctx: AuditContext) -> Iterable[Finding]:
    norms = [r for r in ctx.forward_compute() if r.name == OP]
    taken = {id(r): _takes(ctx, r) for r in norms}
    library = [r for r in norms if taken[id(r)]]
    others = [r for r in norms if taken[id(r)] is False]
    if library:
        yield from _finding(ctx, library, "fuse-group-norm")
    if others:
        yield from _finding(ctx, others, None)


def _finding(ctx: AuditContext, norms: list[OpRecord], fix: str | None) -> Iterable[Finding]:
    acts = _activations(ctx, norms)
    fwd = [o for r in norms for o in (r, *acts.get(id(r), ()))]
    before_s = ctx.time_s(o for r in fwd for o in ctx.with_backward(r))
    nbytes = sum(kernel_bytes(r, ctx.train) for r in norms)
    measured = FAMILY in ctx.gpu.achievable.memory_efficiency
    after_s = ctx.bytes_time_s(nbytes) / ctx.gpu.achievable.memory(FAMILY)
    saving = max(before_s - after_s, 0.0)
    if saving <= 0:
        return
    x = norms[0].inputs[0]
    groups = sorted({int(r.params.get("group", 0)) for r in norms if "group" in r.params})
    evidence = {
        "norms": len(norms),
        "sites": len(norms),  # what the host dispatches instead: one op a norm each way
        "with_activation": len(acts),
        "input_shape": list(x.shape),
        "dtype": x.dtype,
        "groups": groups,
        "time_pytorch_s": before_s,
        "time_kernel_s": after_s,
        "kernel_bytes": nbytes,
        "kernel_efficiency_measured": measured,
        "saving_by_mode_s": {"eager": saving, "graph": saving, "compile": 0.0},
        "why_quiet": QUIET,
    }
    rate = "" if measured else " at the copy rate (gpushape's group-norm kernels unmeasured here)"
    folded = f", {len(acts)} with the activation after them," if acts else ""
    message = (
        f"{len(norms)} group norm(s){folded} run PyTorch's kernels "
        f"({before_s * 1e3:,.3f} ms with the backward), whose statistics take one thread block "
        f"per (sample, group): gpushape's GroupNormAct moves {nbytes / 1e6:,.0f} MB in "
        f"{after_s * 1e3:,.3f} ms{rate}"
    )
    if fix is None:
        module = ctx.model.get_submodule(norms[0].module)
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        evidence["module_class"] = kind
        message += (
            f". {kind} is not a group norm fuse-group-norm knows, so it is left alone: where "
            "its forward is F.group_norm, gpushape.kernels.GroupNormAct.from_module(module) "
            "computes the same"
        )
    yield ctx.finding(
        RULE,
        module_pattern(r.module for r in norms),
        message,
        evidence,
        saving_s=saving,
        fix=fix,
        replaces=fwd,
    )
