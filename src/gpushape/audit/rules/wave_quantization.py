"""wave-quantization: a GEMM or convolution whose tiles fill the SMs poorly in its last wave.

The cost model (trace/gemm_model.py) covers each GEMM's output with the best of the library's
tile shapes and runs the tiles in waves of `gpu.sm_count`; a last wave that is mostly empty
costs as long as a full one. Counted only where it costs time: compute-bound ops, GEMMs of two
waves or more (a single small wave is a batch-size question, not a shape one), last wave under
half full. Saving: the GEMM's compute time x (1 - wave efficiency), what shaping M or N so the
tile count fills whole waves would recover. No transform changes a layer's width or the batch
for you, so `fix` is null.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..context import AuditContext
from ..finding import Finding
from ..patterns import first_modules, module_pattern
from ..registry import register_rule

RULE = "wave-quantization"
MIN_WAVES = 2
MAX_LAST_WAVE_FILL = 0.5


def _sites(ctx: AuditContext) -> dict[tuple, dict]:
    """Sites by GEMM shape, so a layer repeated N times is one finding."""
    sites: dict[tuple, dict] = {}
    for op in ctx.cost.ops:
        if op.bound != "compute":
            continue
        for eff in op.gemms:
            if eff.waves < MIN_WAVES or eff.last_wave_fill >= MAX_LAST_WAVE_FILL:
                continue
            rate = ctx.gpu.attainable_flops(op.math, tensor_cores=op.tensor_cores)
            compute_s = eff.gemm.flops / (rate * eff.efficiency)
            g = eff.gemm
            site = sites.setdefault((g.m, g.n, g.k, g.batch, op.module_type),
                                    {"saving_s": 0.0, "modules": [], "eff": eff})
            site["saving_s"] += compute_s * (1 - eff.wave_eff)
            site["modules"].append(op.module)
    return sites


@register_rule(RULE, title="tiles fill the SMs poorly (last wave mostly idle)")
def check(ctx: AuditContext) -> Iterable[Finding]:
    for site in _sites(ctx).values():
        eff = site["eff"]
        g = eff.gemm
        evidence = {"m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "tile": list(eff.tile),
                    "ctas": eff.ctas, "sm_count": eff.sm_count, "waves": eff.waves,
                    "last_wave_fill": round(eff.last_wave_fill, 3),
                    "wave_efficiency": round(eff.wave_eff, 3), "gemms": len(site["modules"]),
                    "modules": first_modules(site["modules"])}
        message = (f"a {g.m}x{g.n}x{g.k} GEMM makes {eff.ctas} tiles of {eff.tile[0]}x"
                   f"{eff.tile[1]} for {eff.sm_count} SMs: {eff.waves} waves, the last "
                   f"{eff.last_wave_fill:.0%} full; a batch or width that fills whole waves "
                   f"recovers the idle part")
        yield ctx.finding(RULE, module_pattern(site["modules"]), message, evidence,
                          saving_s=site["saving_s"], fix=None)
