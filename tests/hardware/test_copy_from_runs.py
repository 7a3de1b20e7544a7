"""The H100 probe profile's transposed_copy_nchw row agrees with what
benchmarks/hardware/transposed_copy_nchw_from_runs.py derives from the committed H100 per-module
kernel times (equal where the script wrote it; within 5% of the probe's own measurement), and
the same reading of the other direction's copies gives the probe's transposed_copy figure."""

from __future__ import annotations

import pytest

from ._from_runs import assert_agree, derived_and_profile_rows


def test_the_h100_copy_into_nchw_rate_is_what_the_committed_run_gives(monkeypatch, capsys):
    from gpushape.tracing.copies import TRANSPOSED_TO_NCHW

    spec, derived, row = derived_and_profile_rows(
        monkeypatch, "transposed_copy_nchw_from_runs", TRANSPOSED_TO_NCHW
    )
    assert_agree(derived, row, rel=0.05)  # the probe's 0.1681 on 2026-12-07
    # slower than the copy the other way round, which the same run reads at the probe's rate
    other = spec.achievable.memory("transposed_copy")
    assert 0.05 < derived["efficiency"] < other
    check = float(capsys.readouterr().out.split("efficiency ")[1].split()[0])
    assert check == pytest.approx(other, rel=0.1)
