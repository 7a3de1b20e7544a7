"""wave-quantization: a GEMM or convolution whose tiles fill the SMs poorly in its last wave.

The cost model (tracing/gemm_model.py) covers each GEMM's output with one of a few tile shapes and
runs the tiles in waves of `gpu.sm_count`; a last wave that is mostly empty costs as long as a
full one. Libraries choose among many more configurations than that model: tiles of
128 x {64, 128, 192, 256}, 256 x {64, 128}, 64 x {128, 256}, and split-K for deep GEMMs (weight
gradients: K = batch x positions). A user's reshaping helps only where none of those fills the
waves, so the rule looks for the best fill the library could reach (tile efficiency x wave
efficiency) and speaks only when even that leaves more than LIBRARY_FILL_OK idle.
Counted where it costs time: compute-bound ops, GEMMs of MIN_WAVES waves or more (a single
small wave is a batch-size question, not a shape one); not grouped convolutions, which the
cost model prices as one GEMM a group but cuDNN runs with kernels of its own, unmeasured.
Saving: the GEMM's compute time x (1 - best reachable fill). No transform changes a layer's
width or the batch, so `fix` is null.
Where a calibrated profile says the probe looked for wave quantization on this chip and found
no pattern (the H200's: throughput did not fall at wave boundaries), the findings stay at info
and say so: the measurement outranks the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...tracing.flops.registry import Gemm
from ...tracing.gemm_model import SPLIT_K_MIN_DEPTH
from ..context import AuditContext
from ..finding import Finding, Severity
from ..patterns import first_modules, module_pattern
from ..registry import register_rule

RULE = "wave-quantization"
MIN_WAVES = 2
LIBRARY_FILL_OK = 0.9
LIBRARY_TILES = (
    (128, 64),
    (128, 128),
    (128, 192),
    (128, 256),
    (256, 64),
    (256, 128),
    (64, 128),
    (64, 256),
)
ATTENTION_ROWS = (64, 128)
SPLITS = (1, 2, 3, 4)


def _config(tiles: int, used: float, sms: int) -> tuple[float, float]:
    """(tile efficiency, wave efficiency) of `tiles` CTAs doing `used` useful work each."""
    return used, tiles / (math.ceil(tiles / sms) * sms)


def library_fill(g: Gemm, sms: int) -> tuple[float, float, str]:
    """The best (tile efficiency, wave efficiency) the library's configurations reach, by
    their product, and the configuration."""
    best, how = (0.0, 0.0), ""
    options = []
    if g.family == "attention":
        for rows in ATTENTION_ROWS:
            blocks = math.ceil(g.m / rows)
            options.append(
                (_config(blocks * g.batch, g.m / (blocks * rows), sms), f"{rows}-row blocks")
            )
    else:
        for bm, bn in LIBRARY_TILES:
            tm, tn = math.ceil(g.m / bm), math.ceil(g.n / bn)
            used = g.m * g.n / (tm * bm * tn * bn)
            for split in SPLITS:
                if split > 1 and g.k < split * SPLIT_K_MIN_DEPTH:
                    break
                options.append(
                    (
                        _config(tm * tn * g.batch * split, used, sms),
                        f"{bm}x{bn} tiles" + (f", split-K {split}" if split > 1 else ""),
                    )
                )
    for (tile, wave), label in options:
        if tile * wave > best[0] * best[1]:
            best, how = (tile, wave), label
    return best[0], best[1], how


def _sites(ctx: AuditContext) -> dict[tuple, dict]:
    """Sites by GEMM shape, so a layer repeated N times is one finding."""
    sites: dict[tuple, dict] = {}
    for op in ctx.cost.ops:
        if op.bound != "compute" or _grouped(ctx.trace.ops[op.index]):
            continue
        for eff in op.gemms:
            if eff.waves < MIN_WAVES:
                continue
            tile, wave, how = library_fill(eff.gemm, ctx.gpu.sm_count)
            fill = tile * wave
            if fill >= LIBRARY_FILL_OK:
                continue
            rate = ctx.gpu.attainable_flops(op.math, tensor_cores=op.tensor_cores)
            compute_s = eff.gemm.flops / (rate * eff.efficiency)
            g = eff.gemm
            site = sites.setdefault(
                (g.m, g.n, g.k, g.batch, op.module_type),
                {
                    "saving_s": 0.0,
                    "modules": [],
                    "eff": eff,
                    "fill": fill,
                    "tile": tile,
                    "wave": wave,
                    "how": how,
                },
            )
            site["saving_s"] += compute_s * (1 - fill)
            site["modules"].append(op.module)
    return sites


def _grouped(rec) -> bool:
    """A grouped convolution (forward or backward): cuDNN's grouped kernels are not the
    per-group GEMM tiles the model covers, and no probe has measured their waves."""
    return "convolution" in rec.name and int(rec.params.get("groups", 1) or 1) > 1


def _measured_absent(ctx: AuditContext) -> str | None:
    """The probe's verdict when it found no wave quantization on this chip, else None."""
    probe = ctx.measured.get("wave_quantization")
    if isinstance(probe, dict) and probe.get("found") is False:
        return str(probe.get("evidence") or "the probe found no wave-quantization pattern")
    return None


@register_rule(RULE, title="tiles fill the SMs poorly (last wave mostly idle)")
def check(ctx: AuditContext) -> Iterable[Finding]:
    absent = _measured_absent(ctx)
    for site in _sites(ctx).values():
        eff = site["eff"]
        g = eff.gemm
        evidence = {
            "m": g.m,
            "n": g.n,
            "k": g.k,
            "batch": g.batch,
            "family": g.family,
            "sm_count": eff.sm_count,
            "waves": eff.waves,
            "best_library_fill": round(site["fill"], 3),
            "tile_efficiency": round(site["tile"], 3),
            "wave_efficiency": round(site["wave"], 3),
            "best_library_config": site["how"],
            "gemms": len(site["modules"]),
            "modules": first_modules(site["modules"]),
        }
        message = (
            f"a {g.m}x{g.n}x{g.k} GEMM (x{g.batch}) fits {eff.sm_count} SMs poorly: the "
            f"best library configuration ({site['how']}) does useful work in "
            f"{site['tile']:.0%} of each tile and fills its waves {site['wave']:.0%}; "
            f"sizes that fill whole tiles and waves recover the {1 - site['fill']:.0%}"
        )
        if absent:
            evidence["probe"] = absent
            message += f"; but measured on this chip: {absent}"
        yield ctx.finding(
            RULE,
            module_pattern(site["modules"]),
            message,
            evidence,
            saving_s=site["saving_s"],
            fix=None,
            severity=Severity.INFO if absent else None,
        )
