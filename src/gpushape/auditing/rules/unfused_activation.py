"""unfused-activation: an activation written out as a chain of elementwise ops.

Hugging Face's GPT-2 (`gelu_new`, NewGELUActivation) and code like it write the tanh GELU as
its formula, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): eager PyTorch runs each operator
as its own kernel, eight forward and about as many in backward, and every one reads and
writes the whole activation (for GPT-2 124M at 8 x 1024 tokens, 50 MB a kernel, twelve
times). PyTorch has the same function as one kernel each way, `F.gelu(x, approximate="tanh")`
(likewise `F.gelu` for the erf formula and `F.silu` for x * sigmoid(x)), computing in fp32
inside. Found as a module whose forward is only elementwise ops, at least MIN_OPS of them,
one of them tanh, erf or sigmoid. Saving: those ops' kernels, forward and backward, as the
cost model prices them, less one kernel each way moving the input and output once (backward:
the input and the output's gradient in, the input's gradient out). torch.compile fuses such
chains itself (compile mode drops this finding).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding
from ..patterns import first_modules, module_pattern
from ..registry import register_rule

RULE = "unfused-activation"
MIN_OPS = 3
FUNCTIONS = {"tanh": 'F.gelu(x, approximate="tanh")', "erf": "F.gelu(x)", "sigmoid": "F.silu(x)"}


def find_sites(ops: list[OpRecord]) -> list[tuple[str, list[OpRecord]]]:
    """(module, its forward ops) for every module whose forward is an activation written out."""
    by_module: dict[str, list[OpRecord]] = defaultdict(list)
    mixed: set[str] = set()
    for rec in ops:
        if rec.phase != "forward":
            continue
        if "pointwise" in rec.tags and rec.outputs:
            by_module[rec.module].append(rec)
        elif rec.kind != "view":
            mixed.add(rec.module)
    sites = []
    for module, recs in by_module.items():
        names = {r.name.rstrip("_") for r in recs}
        if module in mixed or len(recs) < MIN_OPS or not names & set(FUNCTIONS):
            continue
        sites.append((module, recs))
    return sites


def _function(recs: list[OpRecord]) -> str:
    names = {r.name.rstrip("_") for r in recs}
    return next(FUNCTIONS[n] for n in FUNCTIONS if n in names)


@register_rule(RULE, title="an activation written as several elementwise kernels")
def check(ctx: AuditContext) -> Iterable[Finding]:
    sites = find_sites(ctx.trace.ops)
    if not sites:
        return
    recs = [r for _, site in sites for r in site]
    moved = sum(ctx.op_cost(o).min_bytes for r in recs for o in ctx.with_backward(r))
    passes = 5 if ctx.train else 2  # x in, y out; backward: x and dy in, dx out
    kept = sum(passes * site[0].inputs[0].nbytes for _, site in sites if site[0].inputs)
    saving = ctx.fusion_saving_s(recs, max(moved - kept, 0.0))
    first = sites[0][1]
    kernels = sum(1 + len(ctx.backward_of(r)) for r in first)
    evidence = {
        "sites": len(sites),
        "ops_per_site_forward": len(first),
        "kernels_per_site": kernels,
        "shape": list(first[0].inputs[0].shape) if first[0].inputs else [],
        "module_type": first[0].module_type,
        "function": _function(first),
        "bytes_saved": max(moved - kept, 0.0),
        "modules": first_modules(m for m, _ in sites),
    }
    message = (
        f"{first[0].module_type} runs as {len(first)} elementwise kernels forward "
        f"({kernels} with backward) at {len(sites)} site(s), each moving the whole activation; "
        f"{_function(first)} is one kernel each way (fuse-activation swaps it in)"
    )
    yield ctx.finding(
        RULE,
        module_pattern(m for m, _ in sites),
        message,
        evidence,
        saving_s=saving,
        fix="fuse-activation",
        replaces=recs,
    )
