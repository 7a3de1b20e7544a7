"""A family row derived from committed runs (benchmarks/hardware/*_from_runs.py) beside the
profile's own row of that family."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def derived_and_profile_rows(monkeypatch, script: str, family: str):
    """(the chip's spec with the script's profile applied, the row the script derives, the
    profile's row of `family`); `assert_agree` checks the two rows."""
    pytest.importorskip("timm")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    mod = __import__(script)
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile, read_profile

    profile = read_profile(mod.PROFILE)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin="test")
    return spec, mod.row(spec), profile["memory_efficiency"][family]


def assert_agree(derived: dict, row: dict, rel: float) -> None:
    """Equal where the script wrote the profile's row ("source"), within `rel` of the probe's
    own measurement otherwise."""
    if "source" in row:  # the row the script wrote
        assert row["efficiency"] == pytest.approx(derived["efficiency"], rel=1e-3)
    else:  # the probe's own measurement: the whole-step reading agrees with it
        assert derived["efficiency"] == pytest.approx(row["efficiency"], rel=rel)
