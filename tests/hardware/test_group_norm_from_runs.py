"""The H100 probe profile's group_norm row agrees with what
benchmarks/hardware/group_norm_from_runs.py derives from the committed H100 per-module kernel
times (PoolFormer-S12's GroupNorms): equal where the script wrote it, within 15% of the probe's
own measurement; and well below the row norm's rate that priced these ops before."""

from __future__ import annotations

from ._from_runs import assert_agree, derived_and_profile_rows


def test_the_h100_group_norm_rate_is_what_the_committed_run_gives(monkeypatch):
    spec, derived, row = derived_and_profile_rows(monkeypatch, "group_norm_from_runs", "group_norm")
    assert_agree(derived, row, rel=0.15)
    assert "24 GroupNorm(1, C)" in derived["workload"]
    assert 0.05 < derived["efficiency"] < spec.achievable.memory("norm") / 2
