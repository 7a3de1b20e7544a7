"""unfused-grn: a global response norm (ConvNeXt-V2's GRN) run as PyTorch's separate kernels.

timm's `GlobalResponseNorm` and Hugging Face's `ConvNextV2GRN` compute
y = x + bias + weight * x * g / (mean_c g + eps), g the L2 norm of each channel over the pixels,
as some seven forward ops and a dozen backward ones, each reading or writing a tensor of x's
size: about 35 passes over x a training step, at the rates of their families. On ConvNeXt-V2's
widest tensors (the MLP's 4x hidden width) that is most of the step: in ConvNeXt-V2-Tiny's eager
step on an H100 the GRNs took 20.6 of 40.6 ms of kernel time. gpushape's GRN kernels make 3
passes forward and 5 backward (kernels/grn).

Fires on the forward ops of those modules (by class name; gpushape's own GlobalResponseNorm
records its custom op and is left alone). Where the model is at hand, a module of that name that
is not exactly timm's or transformers' class (a look-alike, a subclass) gets a finding of its
own without a fix: fuse-grn leaves it, and the message says how to use the kernels by hand.
Saving: their ops and the backward ops of them as the cost model prices them, less gpushape's
kernels moving 3 S forward and 5 S backward (S: x's bytes; 3 S in inference) at the rate
measured for them (`fused_grn`; the copy rate where the profile has not measured it), in eager
and graph mode. Under torch.compile Inductor fuses the GRN's ops itself (compile mode prices
that with the rest of its fusion): the finding is info there. **Fix:** `fuse-grn`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ...models.library import is_library_grn
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import module_pattern
from ..registry import register_rule

RULE = "unfused-grn"
FAMILY = "fused_grn"
GRN_TYPES = frozenset({"GlobalResponseNorm", "ConvNextV2GRN"})
FORWARD_PASSES, BACKWARD_PASSES = 3, 5  # over x's bytes: gpushape's kernels
QUIET = {
    "compile": "under torch.compile Inductor fuses the GRN's reductions and elementwise ops "
    "itself (priced with the rest of its fusion)",
}


def grn_modules(ctx: AuditContext) -> dict[str, list[OpRecord]]:
    """module path -> its forward compute ops, for each GRN that runs as PyTorch's ops."""
    found: dict[str, list[OpRecord]] = defaultdict(list)
    for rec in ctx.forward_compute():
        if rec.module_type in GRN_TYPES:
            found[rec.module].append(rec)
    return {m: ops for m, ops in found.items() if not any(_ours(r) for r in ops)}


def _ours(rec: OpRecord) -> bool:
    return rec.op.startswith("gpushape.")


def _input_bytes(ops: list[OpRecord]) -> int:
    """x's bytes: the largest tensor the module's first op reads (the norm over the pixels)."""
    return max((t.nbytes for t in ops[0].inputs), default=0)


def kernel_bytes(ops: list[OpRecord], train: bool) -> int:
    """gpushape's kernels' bytes for one GRN, forward and (training) backward."""
    passes = FORWARD_PASSES + (BACKWARD_PASSES if train else 0)
    return passes * _input_bytes(ops)


def _library(ctx: AuditContext, path: str) -> bool:
    """Whether fuse-grn takes the module at `path` (True where the model is not at hand)."""
    if ctx.model is None:
        return True
    try:
        return is_library_grn(ctx.model.get_submodule(path))
    except AttributeError:
        return True


@register_rule(RULE, title="global response norm as PyTorch's separate kernels")
def check(ctx: AuditContext) -> Iterable[Finding]:
    modules = grn_modules(ctx)
    library = {m: ops for m, ops in modules.items() if _library(ctx, m)}
    others = {m: ops for m, ops in modules.items() if m not in library}
    if library:
        yield from _finding(ctx, library, "fuse-grn")
    if others:
        yield from _finding(ctx, others, None)


def _finding(
    ctx: AuditContext, modules: dict[str, list[OpRecord]], fix: str | None
) -> Iterable[Finding]:
    fwd = [r for ops in modules.values() for r in ops]
    before_s = ctx.time_s(o for r in fwd for o in ctx.with_backward(r))
    nbytes = sum(kernel_bytes(ops, ctx.train) for ops in modules.values())
    measured = FAMILY in ctx.gpu.achievable.memory_efficiency
    after_s = ctx.bytes_time_s(nbytes) / ctx.gpu.achievable.memory(FAMILY)
    saving = max(before_s - after_s, 0.0)
    if saving <= 0:
        return
    first = next(iter(modules.values()))
    x = max(first[0].inputs, key=lambda t: t.nbytes)
    evidence = {
        "modules": len(modules),
        "input_shape": list(x.shape),
        "dtype": x.dtype,
        "ops": len(fwd),
        "time_pytorch_s": before_s,
        "time_kernel_s": after_s,
        "kernel_bytes": nbytes,
        "kernel_efficiency_measured": measured,
        "saving_by_mode_s": {"eager": saving, "graph": saving, "compile": 0.0},
        "why_quiet": QUIET,
    }
    rate = "" if measured else " at the copy rate (gpushape's GRN kernels unmeasured here)"
    message = (
        f"{len(modules)} global response norm(s) run as {len(fwd)} PyTorch ops forward and "
        f"their backward ({before_s * 1e3:,.3f} ms): gpushape's GRN kernels move "
        f"{nbytes / 1e6:,.0f} MB in {after_s * 1e3:,.3f} ms{rate}"
    )
    if fix is None:
        module = ctx.model.get_submodule(next(iter(modules)))
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        evidence["module_class"] = kind
        message += (
            f". {kind} is not timm's GlobalResponseNorm or transformers' ConvNextV2GRN, so "
            "fuse-grn leaves it: where it computes timm's formula, "
            "gpushape.kernels.GlobalResponseNorm(dim, eps, channels_last) does the same"
        )
    yield ctx.finding(
        RULE,
        module_pattern(modules),
        message,
        evidence,
        saving_s=saving,
        fix=fix,
        replaces=fwd,
    )
