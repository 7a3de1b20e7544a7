"""The H100 probe profile's avg_pool_nchw row agrees with what
benchmarks/hardware/avg_pool_from_runs.py derives from the committed H100 per-module kernel times
(EfficientFormer-L1's token mixers): equal where the script wrote it, within 10% of the probe's
own measurement; and well below the max pool's NCHW rate, which priced these ops before."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_h100_average_pool_rate_is_what_the_committed_run_gives(monkeypatch):
    pytest.importorskip("timm")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    mod = __import__("avg_pool_from_runs")
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile, read_profile

    profile = read_profile(mod.PROFILE)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin="test")
    derived = mod.row(spec)
    shipped = profile["memory_efficiency"][mod.FAMILY]
    if "source" in shipped:  # the row this script wrote
        assert shipped["efficiency"] == pytest.approx(derived["efficiency"], rel=1e-3)
    else:  # the probe's own (0.0633 on 2026-12-07): the whole-step reading agrees with it
        assert derived["efficiency"] == pytest.approx(shipped["efficiency"], rel=0.1)
    assert "14 token mixers" in derived["workload"]
    assert 0.01 < derived["efficiency"] < spec.achievable.memory("pool_nchw") / 2
