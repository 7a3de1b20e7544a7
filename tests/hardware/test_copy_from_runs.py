"""The H100 probe profile's transposed_copy_nchw row agrees with what
benchmarks/hardware/transposed_copy_nchw_from_runs.py derives from the committed H100 per-module
kernel times (equal where the script wrote it; within 5% of the probe's own measurement), and
the same reading of the other direction's copies gives the probe's transposed_copy figure."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_h100_copy_into_nchw_rate_is_what_the_committed_run_gives(monkeypatch, capsys):
    pytest.importorskip("timm")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    mod = __import__("transposed_copy_nchw_from_runs")
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile, read_profile
    from gpushape.tracing.copies import TRANSPOSED_TO_NCHW

    profile = read_profile(mod.PROFILE)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin="test")
    derived = mod.row(spec)
    shipped = profile["memory_efficiency"][TRANSPOSED_TO_NCHW]
    if "source" in shipped:  # the row this script wrote
        assert shipped["efficiency"] == pytest.approx(derived["efficiency"], rel=1e-3)
    else:  # the probe's own (0.1681 on 2026-12-07): the whole-step reading agrees with it
        assert derived["efficiency"] == pytest.approx(shipped["efficiency"], rel=0.05)
    # slower than the copy the other way round, which the same run reads at the probe's rate
    other = spec.achievable.memory("transposed_copy")
    assert 0.05 < derived["efficiency"] < other
    check = float(capsys.readouterr().out.split("efficiency ")[1].split()[0])
    assert check == pytest.approx(other, rel=0.1)
