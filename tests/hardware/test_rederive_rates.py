"""benchmarks/hardware/rederive_memory_efficiency.py recomputes a profile's rates from the GPU
times it holds. s2d-stem's rows are rates against the GEMM model of the chip they were measured
on: the committed H100 profile's rows, first calibrated against the H200's numbers, must be the
H100's own (efficiency = the H100's model time / the H100's measured time)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "benchmarks" / "results" / "probe-h100" / "h100-sxm.json"
S2D = ("s2d_stem", "s2d_stem@2", "s2d_fold")


@pytest.fixture
def rederive(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    return __import__("rederive_memory_efficiency").rederive


def _spec(profile):
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile

    return apply_profile(get_gpu(profile["gpu"]), profile, origin="test")


def test_the_h100_profiles_s2d_rows_are_priced_on_the_h100(rederive):
    from gpushape.hardware.profile import read_profile

    profile = read_profile(H100)
    spec = _spec(profile)
    for family in S2D:
        row = profile["memory_efficiency"][family]
        again = rederive(row, family, spec)
        assert again["efficiency"] == pytest.approx(row["efficiency"], abs=1e-4), family
        assert again["family_roofline_s"] == pytest.approx(row["family_roofline_s"], rel=1e-6)


def test_a_row_priced_on_another_chip_changes_by_the_two_chips_rates(rederive):
    from gpushape.hardware.profile import read_profile

    h100 = read_profile(H100)
    h200 = _spec(read_profile(ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"))
    h100_spec = _spec(h100)
    for family in S2D:
        row = h100["memory_efficiency"][family]
        on_h200 = rederive(row, family, h200, why="test")
        assert on_h200["rederived"]["why"] == "test"
        assert on_h200["measured_s"] == row["measured_s"]
        # the H200 copies and multiplies faster: the same measured time is a smaller share
        assert on_h200["family_roofline_s"] < row["family_roofline_s"]
        assert on_h200["efficiency"] < row["efficiency"]
    fold = rederive(h100["memory_efficiency"]["s2d_fold"], "s2d_fold", h200)
    ratio = h100_spec.attainable_bandwidth_bytes_per_s() / h200.attainable_bandwidth_bytes_per_s()
    assert fold["family_roofline_s"] / h100["memory_efficiency"]["s2d_fold"][
        "family_roofline_s"
    ] == pytest.approx(ratio, rel=1e-3)


def test_a_scaled_or_untraced_row_is_refused(rederive):
    from gpushape.hardware.profile import read_profile

    profile = read_profile(H100)
    spec = _spec(profile)
    row = dict(profile["memory_efficiency"]["s2d_stem"], scale=0.01)
    with pytest.raises(ValueError, match="full-size"):
        rederive(row, "s2d_stem", spec)
    with pytest.raises(ValueError, match="traced"):
        rederive(profile["memory_efficiency"]["patch_conv@4"], "patch_conv@4", spec)


def test_calibration_refuses_a_profile_of_another_chip(monkeypatch):
    """calibrate_memory_efficiency.py measures against the profile's own copy and GEMM times:
    on an H100 with the H200's profile it stops with a one-line reason; the profile of the chip
    present, or no GPU (a smoke run on the CPU), passes."""
    from gpushape.hardware.lookup import get_gpu

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    other_chip = __import__("calibrate_memory_efficiency").other_chip
    h100, h200 = get_gpu("h100"), get_gpu("h200")
    reason = other_chip(h100, h200, "h200-sxm.json")
    assert reason and "h200-sxm.json" in reason and h100.name in reason
    assert "\n" not in reason and "--profile" in reason
    assert other_chip(h200, h200, "h200-sxm.json") is None
    assert other_chip(None, h200, "h200-sxm.json") is None
