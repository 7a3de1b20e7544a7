"""The H100 probe profile's avg_pool_nchw row agrees with what
benchmarks/hardware/avg_pool_from_runs.py derives from the committed H100 per-module kernel times
(EfficientFormer-L1's token mixers): equal where the script wrote it, within 10% of the probe's
own measurement; and well below the max pool's NCHW rate, which priced these ops before."""

from __future__ import annotations

from ._from_runs import assert_agree, derived_and_profile_rows


def test_the_h100_average_pool_rate_is_what_the_committed_run_gives(monkeypatch):
    spec, derived, row = derived_and_profile_rows(
        monkeypatch, "avg_pool_from_runs", "avg_pool_nchw"
    )
    assert_agree(derived, row, rel=0.1)  # the probe's 0.0633 on 2026-12-07
    assert "14 token mixers" in derived["workload"]
    assert 0.01 < derived["efficiency"] < spec.achievable.memory("pool_nchw") / 2
