"""The H100 probe profile's avg_pool_nchw row, where it came from
benchmarks/hardware/avg_pool_from_runs.py, is what that script derives from the committed H100
per-module kernel times (EfficientFormer-L1's token mixers): the profile cannot drift from its
source; and it is well below the max pool's NCHW rate, which priced these ops before."""

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
    if "source" in shipped:  # else the probe has measured it since: its own row stands
        assert shipped["efficiency"] == pytest.approx(derived["efficiency"], rel=1e-3)
    assert "14 token mixers" in derived["workload"]
    assert 0.01 < derived["efficiency"] < spec.achievable.memory("pool_nchw") / 2
