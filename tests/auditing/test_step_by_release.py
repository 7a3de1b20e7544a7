"""benchmarks/audit/step_by_release.py's comparison of two releases' audits, and
benchmarks/kernels/time_linear_gemms.py's comparison of a timed GEMM sweep with the cost model:
both read committed JSON on any machine."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "audit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
import step_by_release as sbr
import time_linear_gemms as tlg

ROOT = Path(__file__).resolve().parents[2]

STEP = {"gpu_ms": 10.0, "host_ms": 4.0, "wall_ms": 10.5, "findings": {"tc-align/pad": 1.25}}


def _write(path: Path, torch: str, results: dict) -> str:
    path.write_text(json.dumps({"environment": {"torch": torch}, "results": results}))
    return str(path)


def _audits() -> dict:
    return {"timm:x": {mode: copy.deepcopy(STEP) for mode in sbr.MODES}}


def test_the_same_audits_under_two_releases_do_not_differ(tmp_path, capsys):
    a = _write(tmp_path / "a.json", "2.11.0", _audits())
    b = _write(tmp_path / "b.json", "2.14.1", _audits())
    assert sbr.compare(a, b) == 0
    assert "2.11.0 against 2.14.1" in capsys.readouterr().out


def test_a_changed_step_a_changed_finding_and_a_missing_model_each_count(tmp_path, capsys):
    other = _audits()
    other["timm:x"]["compile"]["gpu_ms"] = 12.0
    other["timm:x"]["eager"]["findings"] = {"tc-align/pad": 0.5}
    other["hf:y"] = {mode: copy.deepcopy(STEP) for mode in sbr.MODES}
    a = _write(tmp_path / "a.json", "2.11.0", _audits())
    b = _write(tmp_path / "b.json", "2.14.1", other)
    assert sbr.compare(a, b) == 3
    out = capsys.readouterr().out
    assert "timm:x compile gpu_ms: 10.000 / 12.000" in out
    assert "timm:x eager findings" in out and "hf:y: only in one file" in out


def test_the_committed_gemm_sweep_compares_with_the_cost_model(capsys):
    folder = ROOT / "benchmarks/results/loops-h100-35"
    profile = ROOT / "benchmarks/results/probe-h100/h100-sxm.json"
    tlg.compare(str(folder / "time_linear_gemms.json"), str(profile))
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.split() and line.split()[0].isdigit()]
    assert len(rows) == len(tlg.ROWS) * len(tlg.WIDTHS)  # the second repetition's, each shape
    # every cell "measured / modelled (modelled over measured)", each ratio a plausible one
    ratios = [float(c.split(")")[0]) for row in rows for c in row.split("(")[1:]]
    assert len(ratios) == 3 * len(rows) and all(0.3 < r < 3 for r in ratios)
