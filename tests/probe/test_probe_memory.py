"""probe_memory's plumbing on the CPU (tiny workloads): every family's workload runs, its ops
fall in its family, and the efficiency is what the formula says, capped to [0.01, 1]."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpushape.hardware import get_gpu
from gpushape.probe import memory as probe_memory


@pytest.fixture(scope="module")
def rows():
    return probe_memory.measure_memory_efficiency(get_gpu("h200"), device="cpu", scale=0.002)


def test_every_family_is_measured_from_its_own_ops(rows):
    # beside them, what a patch convolution's or a stem's two timings give where NCHW ran slower
    derived = {f for f in rows if f.startswith(("nchw_conversion@", "nchw_conversion_stem@"))}
    assert derived <= {"nchw_conversion@4", "nchw_conversion@16", "nchw_conversion_stem@4"}
    assert set(rows) - derived == {w.family for w in probe_memory.WORKLOADS}
    for family, row in rows.items():
        if family in derived:
            assert row["measured_s"] > row["channels_last_s"] and row["scale"] == 0.002
            continue
        assert "error" not in row, (family, row)
        assert row["family_roofline_s"] > 0, family  # the workload's ops are that family's
        assert row["scale"] == 0.002
        if family == "nchw_conversion" and row["efficiency"] is None:  # CPU timings decide
            assert row["measured_s"] <= row["channels_last_s"] and "note" in row
            continue
        assert 0.01 <= row["efficiency"] <= 1.0


def test_efficiency_is_roofline_over_measured_time(rows):
    row = rows["norm"]
    raw = row["family_roofline_s"] / (row["measured_s"] - row["other_roofline_s"])
    assert row["efficiency"] == pytest.approx(min(max(raw, 0.01), 1.0), abs=1e-4)


def test_a_failing_workload_is_reported_not_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setattr(probe_memory, "measure_family", broken)
    out = probe_memory.measure_memory_efficiency(get_gpu("h200"), device="cpu", families=("norm",))
    assert out == {
        "norm": {
            "error": "RuntimeError: no kernel for this dtype",
            "workload": "LayerNorm(4096) on 32768x4096",
        }
    }


def test_the_stem_probe_compares_the_measured_step_with_the_gemm_model():
    from gpushape.probe.convs import measure_small_cin_conv

    row = measure_small_cin_conv(get_gpu("h200"), device="cpu", batch=2, size=32, repeats=4)
    assert row["model_s"] > 0 and row["measured_s"] > 0
    assert row["efficiency"] == pytest.approx(
        min(max(row["model_s"] / row["measured_s"], 0.01), 1.0), abs=1e-4
    )


def _timings(nchw_s: float, cl_s: float):
    from gpushape.bench.timer import Timing

    def fake(steps, **kwargs):
        assert set(steps) == {"nchw", "channels_last"}
        return {
            name: Timing((t,), "perf_counter", 0, False, 1)
            for name, t in (("nchw", nchw_s), ("channels_last", cl_s))
        }

    return fake


def _nchw_row(monkeypatch, nchw_s, cl_s):
    from gpushape.probe import convs as probe_layout

    monkeypatch.setattr(probe_layout, "compare", _timings(nchw_s, cl_s))
    work = next(w for w in probe_memory.WORKLOADS if w.family == "nchw_conversion")
    return probe_layout.measure_nchw_conversion(work, get_gpu("h200"), device="cpu", scale=0.002)


def test_nchw_conversion_is_the_conversions_time_over_the_layouts_difference(monkeypatch):
    from gpushape.probe.convs import conversion_bytes
    from gpushape.tracing.layout import nchw_conversion_bytes

    # the smoke blocks: (32 -> 16 -> 16 -> 32) at 8x8 and (64 -> 32 -> 32 -> 64) at 4x4, batch 2
    blocks = ((32, 16, 8), (64, 32, 4))
    expected = sum(
        nchw_conversion_bytes(
            2 * a * s * s * 2, 2 * b * s * s * 2, grad_input=True, grad_weight=True
        )
        for (c, m, s) in blocks
        for a, b in ((c, m), (m, m), (m, c))
    )
    assert conversion_bytes(blocks, 2, 2) == expected
    assert nchw_conversion_bytes(10, 6, grad_input=True, grad_weight=True) == 96  # 3 x 2 x 16
    assert nchw_conversion_bytes(10, 6, grad_input=False, grad_weight=True) == 64
    family_s = expected / get_gpu("h200").attainable_bandwidth_bytes_per_s()
    row = _nchw_row(monkeypatch, nchw_s=1e-3 + family_s / 0.4, cl_s=1e-3)  # 40% of copy
    assert row["conversion_bytes"] == expected
    assert row["family_roofline_s"] == pytest.approx(family_s)
    assert row["efficiency"] == pytest.approx(0.4, abs=1e-3)


def test_nchw_no_slower_records_no_efficiency(monkeypatch):
    row = _nchw_row(monkeypatch, nchw_s=1e-3, cl_s=1.2e-3)
    assert row["efficiency"] is None and "no slower" in row["note"]


def test_the_probe_keeps_the_rows_a_workload_derives_beside_its_own(monkeypatch):
    """A patch convolution timed in both layouts also gives its NCHW conversions' row: the
    probe's run keeps it in the profile, not only the workload's own row."""
    from gpushape.probe import runner

    def fake(spec, *, device, scale, families):
        (family,) = families
        rows = {family: {"efficiency": 0.5, "measured_s": 1e-3, "workload": family}}
        if family == "patch_conv@16":
            rows["nchw_conversion@16"] = {"efficiency": 0.2, "measured_s": 2e-3, "workload": "w"}
        return rows

    class _Bar:
        def update(self, *args, **kwargs):
            pass

        advance = update

    monkeypatch.setattr(runner.probe_memory, "measure_memory_efficiency", fake)
    plan = SimpleNamespace(memory_scale=0.002)
    out = runner._memory_efficiency(plan, SimpleNamespace(device="cpu"), None, _Bar(), None)
    assert out["nchw_conversion@16"]["efficiency"] == 0.2
    assert out["patch_conv@16"]["efficiency"] == 0.5
    assert set(out) == {w.family for w in runner.probe_memory.WORKLOADS} | {"nchw_conversion@16"}
