"""probe_memory's plumbing on the CPU (tiny workloads): every family's workload runs, its ops
fall in its family, and the efficiency is what the formula says, capped to [0.01, 1]."""

from __future__ import annotations

import pytest

from gpushape.bench import probe_memory
from gpushape.hardware import get_gpu


@pytest.fixture(scope="module")
def rows():
    return probe_memory.measure_memory_efficiency(get_gpu("h200"), device="cpu", scale=0.002)


def test_every_family_is_measured_from_its_own_ops(rows):
    assert set(rows) == {w.family for w in probe_memory.WORKLOADS}
    for family, row in rows.items():
        assert "error" not in row, (family, row)
        assert row["family_roofline_s"] > 0, family  # the workload's ops are that family's
        assert 0.01 <= row["efficiency"] <= 1.0
        assert row["scale"] == 0.002


def test_efficiency_is_roofline_over_measured_time(rows):
    row = rows["norm"]
    raw = row["family_roofline_s"] / (row["measured_s"] - row["other_roofline_s"])
    assert row["efficiency"] == pytest.approx(min(max(raw, 0.01), 1.0), abs=1e-4)


def test_a_failing_workload_is_reported_not_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this dtype")
    monkeypatch.setattr(probe_memory, "measure_family", broken)
    out = probe_memory.measure_memory_efficiency(get_gpu("h200"), device="cpu",
                                                 families=("norm",))
    assert out == {"norm": {"error": "RuntimeError: no kernel for this dtype",
                            "workload": "LayerNorm(4096) on 32768x4096"}}


def test_the_stem_probe_compares_the_measured_step_with_the_gemm_model():
    from gpushape.bench.probe_stem import measure_small_cin_conv

    row = measure_small_cin_conv(get_gpu("h200"), device="cpu", batch=2, size=32, repeats=4)
    assert row["model_s"] > 0 and row["measured_s"] > 0
    assert row["efficiency"] == pytest.approx(
        min(max(row["model_s"] / row["measured_s"], 0.01), 1.0), abs=1e-4)
