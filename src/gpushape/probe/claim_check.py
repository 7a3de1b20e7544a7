"""Checking a rule of thumb against a measurement: claims, A/B timing, and the verdict rule.

The verdict rule, one for every claim unless the claim states its own: a claim is reduced to the
gain the guide promises for following its advice, measured as a ratio of two times minus one
(0.26: the advised variant is 26% faster). The claimed gain is the guide's number where it gives
one; where it gives none ("matters", "is faster"), a material 20% is assumed.

- holds: the measured gain is at least half the claimed gain;
- holds only partly: the gain is in the claimed direction and above the 3% noise floor, but
  less than half the claim;
- does not hold: the gain is 3% or less, or goes the other way;
- within noise: the gain measured round by round spreads across one of those lines (the
  lowest and highest round lie on two sides of it), so the verdict could flip between runs.
  Every A/B claim reports that spread (`gain_spread` in its numbers): the gain of each
  round's medians, the advice against the guide's slow variant in the same round.
"""

from __future__ import annotations

import math
import statistics
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..bench.timer import compare, time_fn
from ..hardware import GPUSpec
from .measure import MeasureConfig, math_mode

HOLDS, PARTLY, FAILS, NOT_MEASURED = "holds", "holds only partly", "does not hold", "not measured"
NOISE = "within noise"
NOISE_FLOOR = 0.03
MATERIAL_GAIN = 0.2
RULE = (
    f"holds if the measured gain is at least half the claimed one; holds only partly if it "
    f"is smaller but above {NOISE_FLOOR:.0%} in the claimed direction; does not hold at "
    f"{NOISE_FLOOR:.0%} or less; within noise when the gain of single rounds spreads across "
    f"one of those lines. A claim without a number is taken as a {MATERIAL_GAIN:.0%} gain."
)


@dataclass(frozen=True, kw_only=True)
class ClaimContext:
    """What a claim measurement may use: where to run, and what the probe already measured."""

    cfg: MeasureConfig
    mode: str  # "quick", "full" or "tiny"
    spec: GPUSpec
    ceilings: Mapping[str, float | None] = field(default_factory=dict)
    sweeps: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    analysis: Mapping[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.cfg.device

    def pick(self, size: Any, *, tiny: Any) -> Any:
        """A claim's workload size: the same in the quick and the full probe (so that both judge
        the same thing; the quick probe saves its time in the sweeps), toy-sized on a CPU smoke
        test."""
        return size if self.mode in ("quick", "full") else tiny


@dataclass(frozen=True, kw_only=True)
class Measured:
    gain: float | None  # measured gain of the guide's advice; None: could not be computed
    numbers: dict[str, Any]  # the measured figures, units in the keys
    how: str  # what was run, in a sentence
    claimed_gain: float | None = None  # overrides the static claim (derived from the spec)
    verdict: str | None = None  # a claim with its own rule sets both
    rule: str | None = None


@dataclass(frozen=True, kw_only=True)
class Claim:
    id: str
    where: str  # where the guide (or docs/design.md) says it
    says: str  # the claim, in English
    claimed: str  # the effect as the guide states it
    claimed_gain: float
    measure: Callable[[ClaimContext], Measured]


REGISTRY: dict[str, Claim] = {}


def claim(
    *, id: str, where: str, says: str, claimed: str, claimed_gain: float = MATERIAL_GAIN
) -> Callable:
    """Register a claim measurement: `@claim(id=..., ...)` over `def measure(ctx) -> Measured`."""

    def register(measure: Callable[[ClaimContext], Measured]) -> Callable[[ClaimContext], Measured]:
        if id in REGISTRY:
            raise ValueError(f"claim {id!r} registered twice")
        REGISTRY[id] = Claim(
            id=id,
            where=where,
            says=says,
            claimed=claimed,
            claimed_gain=claimed_gain,
            measure=measure,
        )
        return measure

    return register


def verdict(
    claimed_gain: float, gain: float | None, spread: tuple[float, float] | None = None
) -> str:
    """The rule in the module docstring; `spread`: the lowest and highest gain of one round."""
    if gain is None or math.isnan(gain):
        return NOT_MEASURED
    if spread is not None:
        lo, hi = min(spread), max(spread)
        half = 0.5 * claimed_gain  # holds from it on; partly only above the floor
        if lo < half <= hi or lo <= NOISE_FLOOR < hi:
            return NOISE
    if gain >= 0.5 * claimed_gain:
        return HOLDS
    return PARTLY if gain > NOISE_FLOOR else FAILS


def gain_of(slow_s: float, fast_s: float) -> float:
    """How much faster the advised variant is: 0.26 = 26% faster."""
    return slow_s / fast_s - 1.0


def ab_rounds(
    variants: Mapping[str, Callable[[], Any]], ctx: ClaimContext
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds per call of each variant, timed alternately in rounds (`bench.compare`), and
    each round's median per call.

    Each timed sample repeats a variant enough times to last about `target_s`, so a short
    kernel's launch latency does not decide the comparison."""
    cfg = ctx.cfg
    loops, inners = {}, {}
    for name, fn in variants.items():
        one = time_fn(fn, warmup=2, repeats=3, device=cfg.device).min_s
        inner = max(1, min(cfg.max_inner, round(cfg.target_s / max(one, 1e-9))))
        loops[name] = lambda fn=fn, inner=inner: [fn() for _ in range(inner)]
        inners[name] = inner
    # the same rounds in the quick and the full probe: a spread over more rounds is wider, and
    # the quick probe's narrower one had called 'holds' what the full one called 'within noise'
    rounds = 5 if ctx.mode in ("quick", "full") else 2
    per_round = max(2, cfg.repeats // 2)
    timings = compare(loops, rounds=rounds, repeats_per_round=per_round, warmup=1,
                      device=cfg.device)  # fmt: skip
    seconds = {name: timings[name].median_s / inners[name] for name in variants}
    by_round = {
        name: [
            statistics.median(timings[name].times_s[r * per_round : (r + 1) * per_round])
            / inners[name]
            for r in range(rounds)
        ]
        for name in variants
    }
    return seconds, by_round


def split_rounds(by_round: dict[str, list[float]]) -> list[dict[str, float]]:
    """`ab_rounds`' per-round medians as one {variant: seconds} per round."""
    names = list(by_round)
    return [dict(zip(names, values)) for values in zip(*(by_round[n] for n in names))]


def rounds_both_picks(
    make: Callable[[], Mapping[str, Callable[[], Any]]], ctx: ClaimContext
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Seconds per call of `make()`'s variants with cuDNN autotuned, and the rounds of two
    timings: autotuned, and with cuDNN's heuristic pick (benchmark off).

    Where several algorithms run a shape about as fast, the autotuner's pick differs from one
    process to the next (2026-12-02: a 64-channel 3x3 conv at batch 512 took 0.247 ms in one
    probe and 0.273 in the other; at batch 256 0.129 and 0.130), and rounds in one process do
    not see it. The heuristic's pick is another algorithm such a process may get: a verdict
    that depends on the pick spreads across a line and reads within noise."""
    with math_mode("bf16", cudnn_benchmark=True):
        seconds, tuned = ab_rounds(make(), ctx)
    with math_mode("bf16", cudnn_benchmark=False):
        _, heuristic = ab_rounds(make(), ctx)
    return seconds, split_rounds(tuned) + split_rounds(heuristic)


def ab_times(variants: Mapping[str, Callable[[], Any]], ctx: ClaimContext) -> dict[str, float]:
    """Seconds per call of each variant (`ab_rounds`)."""
    return ab_rounds(variants, ctx)[0]


def ms(seconds: float) -> float:
    """Seconds as the milliseconds a claim reports."""
    return round(seconds * 1e3, 5)


def ab_gain(
    variants: Mapping[str, Callable[[], Any]], ctx: ClaimContext
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Time two variants, the guide's slow one first and its advice second (`ab_rounds`).

    Returns the advice's gain, each variant's seconds per call, and the numbers a claim
    reports: `<name>_ms` and `gain_spread`, the lowest and highest gain of a single round."""
    (slow, fast), (seconds, by_round) = variants, ab_rounds(variants, ctx)
    gains = [gain_of(a, b) for a, b in zip(by_round[slow], by_round[fast], strict=True)]
    numbers: dict[str, Any] = {f"{name}_ms": ms(seconds[name]) for name in variants}
    numbers["gain_spread"] = [round(min(gains), 4), round(max(gains), 4)]
    return gain_of(seconds[slow], seconds[fast]), seconds, numbers


def check_same(name: str, a: torch.Tensor, b: torch.Tensor, tol: float = 2e-2) -> None:
    """Both variants of a comparison compute the same thing (checked before timing them)."""
    err = float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))
    if not err <= tol:
        raise AssertionError(f"{name}: the two variants disagree (relative error {err:.3g})")


def _spread(numbers: Mapping[str, Any]) -> tuple[float, float] | None:
    spread = numbers.get("gain_spread")
    return (float(spread[0]), float(spread[1])) if spread else None


def _result(c: Claim, m: Measured) -> dict[str, Any]:
    claimed_gain = c.claimed_gain if m.claimed_gain is None else m.claimed_gain
    return {
        "id": c.id,
        "where": c.where,
        "says": c.says,
        "claimed": c.claimed,
        "claimed_gain": round(claimed_gain, 4),
        "gain": None if m.gain is None else round(m.gain, 4),
        "verdict": m.verdict or verdict(claimed_gain, m.gain, _spread(m.numbers)),
        "rule": m.rule or RULE,
        "how": m.how,
        "numbers": m.numbers,
    }


def run_claims(
    claims: Iterable[Claim],
    ctx: ClaimContext,
    on_claim: Callable[[str], None] = lambda claim_id: None,
) -> list[dict[str, Any]]:
    """Measure each claim; a claim that fails is reported as not measured, with the error."""
    results = []
    for c in claims:
        try:
            with torch.no_grad():
                results.append(_result(c, c.measure(ctx)))
        except Exception as exc:  # one broken measurement must not lose the whole probe
            where = traceback.extract_tb(exc.__traceback__)[-1]
            results.append(
                {
                    "id": c.id,
                    "where": c.where,
                    "says": c.says,
                    "claimed": c.claimed,
                    "claimed_gain": c.claimed_gain,
                    "gain": None,
                    "verdict": NOT_MEASURED,
                    "rule": RULE,
                    "how": "",
                    "numbers": {},
                    "error": f"{type(exc).__name__}: {exc} (line {where.lineno})"[:300],
                }
            )
        on_claim(c.id)
    return results
