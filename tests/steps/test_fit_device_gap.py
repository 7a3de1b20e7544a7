"""benchmarks/steps/fit_device_gap.py on the CPU: which timed steps say how long the GPU idles
between kernels, by how each step ran, and the fit over them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "steps"))
import fit_device_gap as fdg


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("eager", "eager"),
        ("channels-last", "eager"),
        ("optimize", None),  # may keep graph-layers: mixed
        ("compile", "compile"),
        ("channels-last+compile", "compile"),
        ("optimize-compile+compile", "compile"),
        ("optimize+graph", "graph"),
        ("optimize-compile+compile-graphs", "compile-graphs"),
        ("optimize-compile+fuse-qkv+compile+graph", None),  # compiled, then captured whole
    ],
)
def test_bench_variants_run_as_their_names_say(name, kind):
    assert fdg.variant_kind(name) == kind


def test_loop_stages_are_mixed_from_graph_layers_on():
    eager = ["as given", "+ no-kv-cache", "+ graph-layers", "+ pad-channels", "+ cuda-graphs"]
    assert fdg.stage_kinds("eager", eager) == {
        "as given": "eager",
        "+ no-kv-cache": "eager",
        "+ graph-layers": None,
        "+ pad-channels": None,
        "+ cuda-graphs": "graph",
    }
    compiled = fdg.stage_kinds("compile", ["as given", "+ fused-optimizer", "+ cuda-graphs"])
    assert compiled == {
        "as given": "compile",
        "+ fused-optimizer": "compile",
        "+ cuda-graphs": "compile-graphs",
    }


def _stage(wall_ms, busy_ms, issue_ms, kernels):
    return {"median_s": wall_ms / 1e3, "gpu_busy_s": busy_ms / 1e3, "issue_s": issue_ms / 1e3,
            "kernels": kernels}  # fmt: skip


def test_only_steps_the_gpu_set_the_pace_of_are_fitted(tmp_path, monkeypatch):
    monkeypatch.setattr(fdg, "RESULTS", tmp_path)
    loop = {
        "mode": "compile",
        "stages": {
            "as given": _stage(26.0, 24.5, 12.0, 500),  # GPU-bound: 3 us a kernel
            "+ no-kv-cache": _stage(24.0, 23.0, 22.0, 500),  # issued in 96% of busy: left out
            "+ cuda-graphs": _stage(23.5, 23.0, 1.0, 500),
        },
    }
    bench = {"variants": {"eager": _stage(50.0, 49.0, 20.0, 500), "optimize": _stage(1, 1, 1, 1)}}
    (tmp_path / "loop.json").write_text(json.dumps(loop))
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    rows = fdg.steps_of(tmp_path / "loop.json") + fdg.steps_of(tmp_path / "bench.json")
    by_step = {r["step"]: r for r in rows}
    assert set(by_step) == {"as given", "+ no-kv-cache", "+ cuda-graphs", "eager"}
    assert by_step["as given"]["gap_s"] == pytest.approx(3e-6)
    assert by_step["as given"]["gpu_bound"] and not by_step["+ no-kv-cache"]["gpu_bound"]
    assert by_step["+ cuda-graphs"]["kind"] == "compile-graphs"
    assert fdg.fit(rows) == {}  # fewer than MIN_STEPS of any kind
    many = [dict(by_step["as given"], gap_s=g * 1e-6) for g in (2.0, 3.0, 4.0, 100.0)]
    fitted = fdg.fit(many)
    assert set(fitted) == {"compile"}
    assert fitted["compile"]["seconds"] == pytest.approx(3.5e-6)  # the median: robust
    assert fitted["compile"]["steps"] == 4
    assert fdg.steps_of(tmp_path / "missing.json") == []


def _steps(model: str, idle_ms, kernels) -> list[dict]:
    return [{"model": model, "kind": "compile", "gpu_bound": True, "kernels": k,
             "busy_s": 0.02, "wall_s": 0.02 + i / 1e3, "gap_s": i / 1e3 / k}
            for i, k in zip(idle_ms, kernels)]  # fmt: skip


def test_a_time_a_step_is_kept_only_where_it_predicts_other_models_better():
    """Idle time that stays put as kernels change (the H100's compiled steps) is fitted as a
    time a step; idle time in proportion to the kernels keeps the gap a kernel."""
    kernels = (300, 500, 800)
    flat = [r for m in "abc" for r in _steps(m, (1.2, 1.2, 1.2), kernels)]
    fitted = fdg.fit(flat)["compile"]
    assert fitted["form"] == "per step and kernel" and fitted["models"] == 3
    assert fitted["step_seconds"] == pytest.approx(1.2e-3) and fitted["seconds"] == 0.0
    err = fitted["held_out_error_s"]
    assert err["per step and kernel"] < err["per kernel"]
    scaled = [r for m, x in zip("abc", (0.9, 1.0, 1.1))
              for r in _steps(m, [k * 2.5e-3 * x for k in kernels], kernels)]  # fmt: skip
    fitted = fdg.fit(scaled)["compile"]
    assert fitted["form"] == "per kernel" and fitted["step_seconds"] == 0.0
    assert fitted["seconds"] == pytest.approx(2.5e-6)
    assert fdg.line(scaled) == pytest.approx((0.0, 2.5e-6), abs=1e-12)  # the same on average
    one_model = _steps("a", (1.2, 1.2, 1.2), kernels)  # nothing held out to judge the line by
    assert fdg.fit(one_model)["compile"]["form"] == "per kernel"
