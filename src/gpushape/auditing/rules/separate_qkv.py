"""separate-qkv: several Linear projections read the same tensor where one GEMM would do.

Found from module calls (auditing/observe.py): sibling nn.Linear modules called on the very same
input tensor (query/key/value of an attention; gate/up of a gated MLP; key/value of a cross
attention). One Linear with the outputs concatenated reads the input once, launches one GEMM
instead of n (each backward GEMM likewise), fills the SMs with one larger grid, and needs no
summing of n input gradients. Both sides are priced as Linear kernels by the cost model
(pricing/linear.py): n separate layers plus the n - 1 gradient additions, against one layer
of width sum(N), whose output is split into the members' views: in training autograd copies
their n gradients back into one (a cat kernel over the fused output's gradient, which the
fused side pays; on a LLaMA-style decoder's eight layers, eager, 0.62 ms a step, more than the
merged GEMMs saved there).

Under torch.compile the rule stays quiet for projections whose attention applies rotary position
embeddings (Hugging Face attention modules given `position_embeddings`, or holding a rotary
child): Inductor fuses the rotary embedding's backward with the concatenation of the query and
key gradients into the fused projection's gradient, one kernel far below the copy rate. On a
LLaMA-style decoder (8 layers, 8192 tokens, H100) that kernel took 1.23 ms a step where the two
it replaced took 0.40, while the merged GEMMs saved 0.34 (benchmarks/results/loops-h100-9); the
compiled step ran 0.65 ms slower on the H200 (loops-h200-5).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable

from ..context import AuditContext
from ..finding import Finding
from ..observe import ModuleCall
from ..patterns import module_pattern
from ..pricing.linear import linear_records
from ..pricing.synth import record, tensor
from ..registry import register_rule

RULE = "separate-qkv"
LINEAR_TYPES = ("Linear",)


def _groups(ctx: AuditContext) -> list[list[ModuleCall]]:
    """Calls of sibling Linear modules on one input tensor, two or more distinct modules."""
    groups: dict[tuple[str, int], list[ModuleCall]] = {}
    for call in ctx.observed.calls:
        if call.module_type in LINEAR_TYPES and call.inputs:
            parent = call.module.rpartition(".")[0]
            groups.setdefault((parent, call.inputs[0]), []).append(call)
    return [calls for calls in groups.values() if len({c.module for c in calls}) >= 2]


def _layer(ctx: AuditContext, path: str):
    try:
        return ctx.model.get_submodule(path)
    except AttributeError:
        return None


ROTARY_CHILDREN = ("rotary_emb", "rotary", "rope")
WHY_ROTARY = (
    "Inductor fuses the rotary embedding's backward with the concatenation of the query and "
    "key gradients into one slow kernel, which costs more than the merged GEMMs save (a "
    "LLaMA-style decoder on an H100: +0.84 ms a step against 0.34 saved)"
)


def applies_rotary(module) -> bool:
    """Whether an attention module applies rotary position embeddings: its forward takes
    `position_embeddings` (Hugging Face's LLaMA family), or it holds a rotary child."""
    if module is None:
        return False
    if any(name in ROTARY_CHILDREN for name, _ in module.named_children()):
        return True
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False
    return "position_embeddings" in params


def _price(ctx: AuditContext, calls: list[ModuleCall]) -> dict | None:
    layers = [_layer(ctx, c.module) for c in calls]
    if any(layer is None or not hasattr(layer, "out_features") for layer in layers):
        return None
    k = layers[0].in_features
    m = math.prod(calls[0].input_shapes[0]) // k  # tokens
    dtype = str(layers[0].weight.dtype).removeprefix("torch.")
    widths = [layer.out_features for layer in layers]
    bias = all(layer.bias is not None for layer in layers)
    separate = [
        r for n in widths for r in linear_records(m, k, n, dtype, bias=bias, train=ctx.train)
    ]
    if ctx.train:  # autograd sums the n input gradients: n - 1 additions of (M, K)
        x = tensor((m, k), dtype)
        separate += [
            record("aten.add.Tensor", {"self": x, "other": x}, [x], phase="backward")
            for _ in widths[1:]
        ]
    fused = linear_records(m, k, sum(widths), dtype, bias=bias, train=ctx.train)
    if ctx.train:  # the split's backward: the n output gradients copied into one (a cat)
        grads = {f"tensors[{i}]": tensor((m, n), dtype) for i, n in enumerate(widths)}
        whole = tensor((m, sum(widths)), dtype)
        fused.append(record("aten.cat.default", grads, [whole], params={"dim": -1},
                            phase="backward"))  # fmt: skip
    return {
        "separate_s": ctx.price(separate),
        "fused_s": ctx.price(fused),
        "tokens": m,
        "in_features": k,
        "out_features": widths,
        "dtype": dtype,
        "projections": [c.module.rpartition(".")[2] for c in calls],
        "rotary": applies_rotary(_layer(ctx, calls[0].module.rpartition(".")[0])),
    }


@register_rule(RULE, title="projections of the same input as separate GEMMs")
def check(ctx: AuditContext) -> Iterable[Finding]:
    if ctx.model is None:
        return
    by_kind: dict[tuple, list[tuple[str, dict]]] = {}
    for calls in _groups(ctx):
        priced = _price(ctx, calls)
        if priced is not None:
            kind = (tuple(priced["projections"]), priced["in_features"])
            priced["calls"] = [c.module for c in calls]
            by_kind.setdefault(kind, []).append((calls[0].module.rpartition(".")[0], priced))
    for (names, k), sites in by_kind.items():
        separate_s = sum(p["separate_s"] for _, p in sites)
        fused_s = sum(p["fused_s"] for _, p in sites)
        first = sites[0][1]
        evidence = {
            "projections": list(names),
            "in_features": k,
            "out_features": first["out_features"],
            "tokens": first["tokens"],
            "dtype": first["dtype"],
            "sites": len(sites),
            "time_separate_s": separate_s,
            "time_fused_s": fused_s,
            "parents": [path for path, _ in sites],
        }
        if all(p["rotary"] for _, p in sites):
            evidence["saving_by_mode_s"] = {"compile": 0.0}
            evidence["why_quiet"] = {"compile": WHY_ROTARY}
        message = (
            f"{', '.join(names)} are {len(names)} Linear layers reading the same input "
            f"({len(sites)} site(s)): one Linear of width {sum(first['out_features'])} "
            f"reads it once and launches one GEMM per pass"
        )
        yield ctx.finding(
            RULE,
            module_pattern(path for path, _ in sites),
            message,
            evidence,
            saving_s=max(separate_s - fused_s, 0.0),
            fix="fuse-qkv",
            replaces=ctx.records_of(m for _, p in sites for m in p["calls"]),
        )
