"""Where throughput falls off a cliff: pure analysis of (size, throughput) curves.

Nothing here touches a GPU: `gpushape probe` measures the curves, this module reads them, and the
CPU tests feed it synthetic ones.

Alignment granularity. A size's *level* is the largest power of two that divides it (4104 = 8 x
513 has level 8). Within one curve, throughput is made relative to the curve's full speed (the
median of its fastest few points, so one lucky sample does not set it). Relative throughputs are
pooled by level over every curve of one dtype and dimension, and a level is *slow* when its median
falls below `1 - drop`. The granularity is twice the highest slow level: sizes that are multiples
of it run at full speed, sizes that miss it (while hitting half of it) do not. A level seen at a
single point, slow while the level below it runs at full speed, is an outlier, not a cliff.

Wave quantization. A GEMM of M x N output tiles of tm x tn runs in ceil(tiles / SMs) waves; the last
wave leaves SMs idle, so throughput follows tiles / (waves x SMs). `fit_wave_pattern` tries tile
shapes, keeps the one whose predicted efficiency best explains the measured sawtooth (Pearson
correlation over sizes with at least one full wave), and says whether the pattern is there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_DROP = 0.2  # a cliff is a fall of more than 20% (the definition)
MAX_LEVEL = 128  # levels above this are pooled with it: no tensor-core rule asks for more
_TOP_FRACTION = 0.2  # full speed = median of the fastest 20% of a curve's points (at least 3)


@dataclass(frozen=True)
class Curve:
    """One sweep: throughput (any unit, higher is faster) at each size of one dimension.

    A `None` throughput is a size that did not run at all (fp8 GEMMs demand multiples of 16):
    it counts as zero throughput, the deepest cliff there is.
    """

    sizes: tuple[int, ...]
    throughputs: tuple[float | None, ...]
    label: str = ""

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.throughputs):
            raise ValueError(
                f"curve {self.label!r}: {len(self.sizes)} sizes but "
                f"{len(self.throughputs)} throughputs"
            )
        if any(s <= 0 for s in self.sizes):
            raise ValueError(f"curve {self.label!r}: sizes must be positive")


def alignment_level(size: int, cap: int = MAX_LEVEL) -> int:
    """Largest power of two dividing `size`, at most `cap`: 4104 -> 8, 4095 -> 1, 4096 -> cap."""
    return min(size & -size, cap)


def full_speed(values: Sequence[float]) -> float:
    """Median of the fastest fifth of the values (at least three): robust to one lucky sample."""
    ordered = sorted(values, reverse=True)
    top = max(3, math.ceil(_TOP_FRACTION * len(ordered)))
    return statistics.median(ordered[:top])


def relative(curve: Curve) -> list[tuple[int, float]]:
    """(size, throughput / the curve's full speed); sizes that failed get 0."""
    values = [t or 0.0 for t in curve.throughputs]
    ref = full_speed(values) if values else 0.0
    if ref <= 0:
        return [(s, 0.0) for s in curve.sizes]
    return [(s, v / ref) for s, v in zip(curve.sizes, values)]


@dataclass(frozen=True)
class LevelStat:
    level: int  # sizes whose largest power-of-two divisor is this (pooled above MAX_LEVEL)
    points: int
    median_relative: float
    slow: bool  # median below 1 - drop, and not a lone outlier


@dataclass(frozen=True)
class Granularity:
    """The measured alignment cliff of one dtype and dimension, with its evidence."""

    granularity: int  # sizes should be multiples of this; 1: no cliff found
    drop: float  # the threshold used: slow = below (1 - drop) of full speed
    levels: tuple[LevelStat, ...]
    aligned_relative: float  # median relative throughput of sizes that are multiples
    missed_relative: float | None  # ... of sizes that miss it (None when g = 1)
    outliers: tuple[int, ...] = ()  # lone slow levels ignored as noise
    curves: int = 0

    @property
    def cliff(self) -> bool:
        return self.granularity > 1

    @property
    def fall(self) -> float | None:
        """Fractional fall from aligned to missed sizes (0.8 = 80% slower)."""
        if self.missed_relative is None or self.aligned_relative <= 0:
            return None
        return 1.0 - self.missed_relative / self.aligned_relative

    def evidence(self) -> str:
        by_level = ", ".join(f"{_level_name(s.level)} {s.median_relative:.2f}" for s in self.levels)
        if self.cliff:
            head = (
                f"multiples of {self.granularity} run at {self.aligned_relative:.2f} of full "
                f"speed, other sizes at {self.missed_relative:.2f}"
            )
        else:
            head = f"no level falls by more than {self.drop:.0%}"
        tail = f"; ignored lone outliers at {list(self.outliers)}" if self.outliers else ""
        return (
            f"{head} (median relative throughput by level: {by_level}; {self.curves} curves){tail}"
        )

    def to_dict(self) -> dict:
        return {
            "granularity": self.granularity,
            "drop_threshold": self.drop,
            "aligned_relative": round(self.aligned_relative, 4),
            "missed_relative": (
                None if self.missed_relative is None else round(self.missed_relative, 4)
            ),
            "levels": {
                str(s.level): {
                    "points": s.points,
                    "median_relative": round(s.median_relative, 4),
                    "slow": s.slow,
                }
                for s in self.levels
            },
            "outliers": list(self.outliers),
            "curves": self.curves,
            "evidence": self.evidence(),
        }


def _level_name(level: int) -> str:
    return "odd" if level == 1 else f"x{level}"


def _level_stats(pooled: dict[int, list[float]], drop: float) -> tuple[list[LevelStat], list[int]]:
    stats, outliers = [], []
    below_slow = True  # the level under the lowest one counts as slow: a lone odd size can be real
    for level in sorted(pooled):
        values = pooled[level]
        med = statistics.median(values)
        slow = med < 1.0 - drop
        if slow and len(values) == 1 and not below_slow:
            outliers.append(level)
            slow = False
        stats.append(LevelStat(level, len(values), med, slow))
        below_slow = slow
    return stats, outliers


def find_granularity(
    curves: Sequence[Curve], *, drop: float = DEFAULT_DROP, cap: int = MAX_LEVEL
) -> Granularity:
    """The alignment granularity that curves of one dtype and dimension show (module docstring)."""
    if not curves:
        raise ValueError("find_granularity needs at least one curve")
    if not 0.0 < drop < 1.0:
        raise ValueError(f"drop must lie in (0, 1), got {drop}")
    pooled: dict[int, list[float]] = {}
    for curve in curves:
        for size, rel in relative(curve):
            pooled.setdefault(alignment_level(size, cap), []).append(rel)
    levels, outliers = _level_stats(pooled, drop)
    slow_levels = [s.level for s in levels if s.slow]
    granularity = min(2 * max(slow_levels), cap) if slow_levels else 1
    aligned = [r for lv, rs in pooled.items() if lv >= granularity for r in rs]
    missed = [r for lv, rs in pooled.items() if lv < granularity for r in rs]
    return Granularity(
        granularity=granularity,
        drop=drop,
        levels=tuple(levels),
        aligned_relative=statistics.median(aligned) if aligned else 0.0,
        missed_relative=statistics.median(missed) if missed else None,
        outliers=tuple(outliers),
        curves=len(curves),
    )


def slow_sizes(curve: Curve, drop: float = DEFAULT_DROP) -> list[int]:
    """Sizes of one curve that run more than `drop` below its full speed (marked on plots)."""
    return [s for s, r in relative(curve) if r < 1.0 - drop]


# ---- wave quantization -------------------------------------------------------------------------
# Output tile shapes (rows x columns) a GEMM library picks from on recent NVIDIA chips.
TILE_CANDIDATES: tuple[tuple[int, int], ...] = (
    (64, 64),
    (64, 128),
    (128, 64),
    (128, 128),
    (128, 256),
    (256, 128),
    (256, 256),
)


def tile_count(m: int, n: int, tile: tuple[int, int]) -> int:
    return math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def wave_efficiency(tiles: int, sm_count: int) -> float:
    """Busy fraction of SM time when `tiles` equal tiles run one per SM: tiles / (waves x SMs)."""
    if tiles <= 0 or sm_count <= 0:
        raise ValueError(f"need positive tiles and SM count, got {tiles}, {sm_count}")
    waves = math.ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


@dataclass(frozen=True)
class WaveFit:
    tile: tuple[int, int]  # the best-explaining output tile (rows of M, columns of N)
    correlation: float  # Pearson r of measured throughput against predicted efficiency
    points: int  # sizes with at least one full wave, over which r was computed
    boundary_drops: int  # wave boundaries (efficiency falls > 20%) where throughput fell > 10%
    boundaries: int  # wave boundaries in the sweep
    found: bool  # correlation >= min_correlation and most boundaries show the drop
    predicted: tuple[float, ...] = field(default=())  # efficiency at every size of the sweep

    def evidence(self) -> str:
        verdict = (
            "wave quantization visible" if self.found else "no clear wave-quantization pattern"
        )
        return (
            f"{verdict}: best tile {self.tile[0]}x{self.tile[1]}, r = {self.correlation:.2f} "
            f"over {self.points} sizes with a full wave; throughput fell at "
            f"{self.boundary_drops} of {self.boundaries} wave boundaries"
        )

    def to_dict(self) -> dict:
        return {
            "tile": list(self.tile),
            "correlation": round(self.correlation, 4),
            "points": self.points,
            "boundary_drops": self.boundary_drops,
            "boundaries": self.boundaries,
            "found": self.found,
            "predicted_efficiency": [round(p, 4) for p in self.predicted],
            "evidence": self.evidence(),
        }


def _boundary_drops(
    ms: Sequence[int], values: Sequence[float], eff: Sequence[float]
) -> tuple[int, int]:
    hits = total = 0
    for i in range(1, len(ms)):
        if eff[i] < 0.8 * eff[i - 1]:
            total += 1
            hits += values[i] < 0.9 * values[i - 1]
    return hits, total


def fit_wave_pattern(
    ms: Sequence[int],
    n: int,
    throughputs: Sequence[float],
    sm_count: int,
    *,
    candidates: Sequence[tuple[int, int]] = TILE_CANDIDATES,
    min_correlation: float = 0.7,
) -> WaveFit:
    """Which tile shape's wave efficiency explains throughput(M) at fixed N (sorted by M)."""
    if len(ms) != len(throughputs) or len(ms) < 4:
        raise ValueError("fit_wave_pattern needs at least 4 (M, throughput) pairs of equal length")
    best: WaveFit | None = None
    for tile in candidates:
        tiles = [tile_count(m, n, tile) for m in ms]
        eff = [wave_efficiency(t, sm_count) for t in tiles]
        full = [(e, v) for t, e, v in zip(tiles, eff, throughputs) if t >= sm_count]
        if len(full) < 4:
            continue
        r = _pearson([e for e, _ in full], [v for _, v in full])
        hits, total = _boundary_drops(ms, throughputs, eff)
        found = r >= min_correlation and total > 0 and hits * 2 >= total
        fit = WaveFit(tile, r, len(full), hits, total, found, tuple(eff))
        if best is None or r > best.correlation:
            best = fit
    if best is None:
        raise ValueError(
            f"no tile shape gives 4 sizes with a full wave of {sm_count} SMs: sweep larger M"
        )
    return best
