"""tc-align: a GEMM or convolution dimension misses the tensor-core granularity of its dtype.

Which dimensions count is the cost model's business (tracing/gemm_model.py): the leading
dimensions of GEMM operands (K and N of a Linear; M alone does not matter, as the H200 showed)
and a convolution's channels per group. The granularity is `gpu.tc_alignment(dtype)` (measured
when a profile is applied); the padded size comes from `hardware.alignment`, the rule the
pad-channels transform pads by. The saving is the cost model's time for the op and its
backward as traced minus the same ops with the dimension padded to the granularity.

Tiny channel counts (fewer than the granularity, as a 3-channel image stem) are not worth
padding: cuDNN pads them itself, so the traced conv already runs on padded data, and such a
conv is memory-bound, where padding only adds bytes. The cost is taken as the padded one's and
the finding stays at info with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...hardware.alignment import granularity, round_up
from ...tracing.records import OpRecord
from ..context import AuditContext
from ..finding import Finding, Severity
from ..pricing.padding import is_conv, pad_records, parse_misaligned
from ..registry import register_rule

RULE = "tc-align"


def _misaligned(ctx: AuditContext, recs: list[OpRecord]) -> dict[int, str]:
    """Misaligned dimension values of these ops -> the name the first op gave it."""
    found: dict[int, str] = {}
    for rec in recs:
        for text in ctx.op_cost(rec).misaligned:
            parsed = parse_misaligned(text)
            if parsed is not None:
                found.setdefault(parsed[1], parsed[0])
    return found


def _is_feature(ctx: AuditContext, module: str, value: int) -> bool:
    """Whether `value` is a size of the module's weight (a width one can pad) rather than a
    batch or sequence size."""
    if ctx.model is None:
        return True
    try:
        weight = getattr(ctx.model.get_submodule(module), "weight", None)
    except AttributeError:
        return True
    return weight is None or value in tuple(weight.shape)


def _site(ctx: AuditContext, fwd: OpRecord, value: int, name: str) -> dict | None:
    recs = ctx.with_backward(fwd)
    cost = ctx.op_cost(fwd)
    align = granularity("gemm", ctx.gpu, cost.math)  # cost.math: the dtype the op runs in
    padded = round_up(value, align)
    if padded == value:
        return None
    as_is_s = ctx.time_s(recs)
    padded_s = ctx.price(pad_records(recs, value, padded))
    library_pads = is_conv(fwd) and value < align
    return {
        "module": fwd.module,
        "op": fwd.op,
        "dim": name,
        "value": value,
        "padded": padded,
        "align": align,
        "math": cost.math,
        "as_is_s": as_is_s,
        "padded_s": padded_s,
        "saving_s": 0.0 if library_pads else as_is_s - padded_s,
        "library_pads": library_pads,
        "bound": cost.bound,
        "efficiency": round(cost.efficiency, 3),
        "ops": len(recs),
        "shapes": [list(t.shape) for t in fwd.inputs[:2]],
    }


def _merge(sites: list[dict]) -> dict[tuple[str, int], dict]:
    merged: dict[tuple[str, int], dict] = {}
    for s in sites:
        key = (s["module"], s["value"])
        if key in merged:
            m = merged[key]
            for k in ("as_is_s", "padded_s", "saving_s", "ops"):
                m[k] += s[k]
        else:
            merged[key] = dict(s)
    return merged


def _message(s: dict, saving_s: float, feature: bool) -> str:
    what = (
        f"{s['dim']}={s['value']} misses the {s['align']}-element {s['math']} tensor-core "
        f"granularity"
    )
    if s["library_pads"]:
        return (
            f"{what}, but {s['value']} channels are fewer than {s['align']}: the library "
            f"pads them itself, so padding the model saves nothing (a {s['bound']}-bound "
            f"conv at {s['efficiency']:.0%} of the GEMM rate)"
        )
    if saving_s <= 0:
        return (
            f"{what}, but padding to {s['padded']} saves nothing here ({s['bound']}-bound: "
            f"the extra work costs as much as the faster kernel gains)"
        )
    how = (
        f"pad it to {s['padded']}"
        if feature
        else (f"make the batch x sequence a multiple of {s['align']} (pad to {s['padded']})")
    )
    return f"{what} ({s['bound']}-bound, {s['efficiency']:.0%} GEMM efficiency as is): {how}"


@register_rule(RULE, title="a matmul/conv dimension misses the tensor-core granularity")
def check(ctx: AuditContext) -> Iterable[Finding]:
    sites = []
    for fwd in ctx.forward_compute():
        if not ctx.op_cost(fwd).gemms:
            continue
        for value, name in _misaligned(ctx, ctx.with_backward(fwd)).items():
            site = _site(ctx, fwd, value, name)
            if site is not None:
                sites.append(site)
    for s in _merge(sites).values():
        saving_s = max(s["saving_s"], 0.0)
        feature = _is_feature(ctx, s["module"], s["value"])
        evidence = {
            "dim": s["dim"],
            "value": s["value"],
            "padded_to": s["padded"],
            "alignment_elems": s["align"],
            "dtype": s["math"],
            "op": s["op"],
            "input_shapes": s["shapes"],
            "bound": s["bound"],
            "gemm_efficiency": s["efficiency"],
            "time_as_is_s": s["as_is_s"],
            "time_padded_s": s["padded_s"],
            "ops_priced": s["ops"],
        }
        if s["library_pads"]:
            evidence["library_pads_tiny_channels"] = True
        worth = saving_s > 0
        yield ctx.finding(
            RULE,
            s["module"],
            _message(s, saving_s, feature),
            evidence,
            saving_s=saving_s,
            fix="pad-channels" if feature and worth else None,
            severity=None if worth else Severity.INFO,
            replaces=ctx.records_of([s["module"]]),
        )
