"""Cliff detection on synthetic timing curves (no GPU): clean, noisy, absent, and wave sawtooth."""

import math
import random

import pytest

from gpushape.probe.cliffs import (
    Curve,
    alignment_level,
    find_granularity,
    fit_wave_pattern,
    full_speed,
    slow_sizes,
    tile_count,
    wave_efficiency,
)

OFFSETS = (-8, -4, -2, -1, *range(17), 24, 32, 64, 128)


def _curves(granularity, *, noise=0.0, seed=0, fast=700.0, slow_by_level=None, bases=(1024, 4096)):
    """Curves around each base: full speed at multiples of `granularity`, a cliff elsewhere."""
    rng = random.Random(seed)
    slow_by_level = slow_by_level or {1: 0.2, 2: 0.25, 4: 0.3, 8: 0.45, 16: 0.5, 32: 0.55}
    curves = []
    for base in bases:
        sizes = tuple(base + o for o in OFFSETS)
        values = []
        for s in sizes:
            level = alignment_level(s)
            rel = 1.0 if s % granularity == 0 else slow_by_level[level]
            values.append(fast * rel * (1.0 + rng.uniform(-noise, noise)))
        curves.append(Curve(sizes, tuple(values), label=f"base {base}"))
    return curves


def test_alignment_level():
    sizes = (4095, 4100, 4104, 4112, 4096, 96)
    assert [alignment_level(s) for s in sizes] == [1, 4, 8, 16, 128, 32]
    assert alignment_level(4096, cap=4096) == 4096


def test_full_speed_ignores_one_lucky_sample():
    values = [100.0] * 20 + [10.0] * 20 + [500.0]
    assert full_speed(values) == 100.0


@pytest.mark.parametrize("granularity", [8, 16])
def test_clean_cliff(granularity):
    g = find_granularity(_curves(granularity))
    assert g.granularity == granularity and g.cliff
    assert g.aligned_relative == pytest.approx(1.0)
    assert g.fall > 0.5
    slow = {s.level for s in g.levels if s.slow}
    assert slow == {lv for lv in (1, 2, 4, 8, 16, 32, 64) if lv < granularity}
    assert f"multiples of {granularity}" in g.evidence()


@pytest.mark.parametrize("seed", range(5))
def test_noisy_cliff_of_8(seed):
    # +-8% noise on every point: the bf16 cliff still reads as 8, never 4 or 16
    g = find_granularity(_curves(8, noise=0.08, seed=seed))
    assert g.granularity == 8


def test_no_cliff_in_noise():
    flat = {lv: 1.0 for lv in (1, 2, 4, 8, 16, 32)}
    for seed in range(5):
        g = find_granularity(_curves(1, noise=0.1, seed=seed, slow_by_level=flat))
        assert g.granularity == 1 and not g.cliff and g.missed_relative is None
        assert "no level falls" in g.evidence()


def test_mild_drop_is_not_a_cliff():
    # unaligned sizes 12% slower: below the 20% threshold, above it with drop=0.1
    mild = {lv: 0.88 for lv in (1, 2, 4)}
    curves = _curves(8, slow_by_level={**mild, 8: 1, 16: 1, 32: 1})
    assert find_granularity(curves).granularity == 1
    assert find_granularity(curves, drop=0.1).granularity == 8


def test_lone_slow_point_high_up_is_an_outlier():
    sizes = (4095, 4096, 4097, 4100, 4104, 4112, 4128, 4160, 4224)
    values = (150, 700, 140, 200, 690, 700, 695, 400, 700)  # 4160 (x64) alone dips 43%
    g = find_granularity([Curve(sizes, values)])
    assert g.granularity == 8 and g.outliers == (64,)


def test_failed_sizes_count_as_zero():
    # fp8 GEMMs refuse sizes that are not multiples of 16
    sizes = tuple(4096 + o for o in OFFSETS)
    values = tuple(1300.0 if s % 16 == 0 else None for s in sizes)
    g = find_granularity([Curve(sizes, values)])
    assert g.granularity == 16 and g.missed_relative == 0.0


def test_slow_sizes_and_validation():
    curve = Curve((4095, 4096, 4100, 4104, 4128), (150.0, 737.0, 211.0, 681.0, 662.0))
    assert slow_sizes(curve) == [4095, 4100]
    with pytest.raises(ValueError, match="2 sizes but 1"):
        Curve((1, 2), (1.0,))
    with pytest.raises(ValueError, match="at least one curve"):
        find_granularity([])


def test_wave_efficiency():
    assert wave_efficiency(132, 132) == 1.0
    assert wave_efficiency(133, 132) == pytest.approx(133 / 264)
    assert tile_count(4096, 4096, (128, 256)) == 32 * 16
    with pytest.raises(ValueError):
        wave_efficiency(0, 132)


@pytest.mark.parametrize("tile", [(128, 256), (128, 128)])
def test_wave_sawtooth_is_found(tile):
    rng = random.Random(1)
    sms, n = 132, 4096
    ms = [128 * i for i in range(1, 65)]
    values = [
        800.0 * wave_efficiency(tile_count(m, n, tile), sms) * (1 + rng.uniform(-0.03, 0.03))
        for m in ms
    ]
    fit = fit_wave_pattern(ms, n, values, sms)
    assert fit.tile == tile and fit.found and fit.correlation > 0.9
    assert fit.boundaries > 0 and fit.boundary_drops * 2 >= fit.boundaries
    assert "wave quantization visible" in fit.evidence()


def test_smooth_curve_has_no_wave_pattern():
    # a library with stream-K scheduling: throughput saturates smoothly, no sawtooth
    rng = random.Random(2)
    ms = [128 * i for i in range(1, 65)]
    values = [800.0 * (1 - math.exp(-m / 1500)) * (1 + rng.uniform(-0.02, 0.02)) for m in ms]
    fit = fit_wave_pattern(ms, 4096, values, 132)
    assert not fit.found
    assert "no clear" in fit.evidence()
