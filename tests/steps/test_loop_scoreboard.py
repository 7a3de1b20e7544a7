"""benchmarks/steps/loop_scoreboard.py on the CPU: how a re-predicted fix is judged against
the advice's target, the counts over many loops, and which result files are loops."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "steps"))
import loop_scoreboard as sb

STEP = 0.020  # a 20 ms step: 1% of it, 0.2 ms, is where a finding becomes medium


@pytest.mark.parametrize(
    ("predicted", "measured", "noisy", "fix", "expected"),
    [
        (0.001, 0.001, False, "pad-channels", "meets"),
        (0.001, 0.0005, False, "pad-channels", "meets"),  # 2x: the band's edge, inside
        (0.001, 0.00049, False, "pad-channels", "misses"),  # just past 2x
        (0.001, 0.0021, False, "pad-channels", "misses"),  # under 0.5x
        (0.001, -0.0002, False, "sdpa", "misses"),  # a high finding that saved nothing
        (0.001, -0.0002, True, "sdpa", "within noise"),
        (0.0001, 0.003, False, "fused-optimizer", "low"),  # under 1% of the step
        (None, 0.003, False, "cuda-graphs", "low"),  # no prediction on the run's host
        (0.005, 0.005, False, "graph-layers", "not judged"),  # kept on a timing, not a finding
    ],
)
def test_a_fix_is_judged_as_the_results_page_judges_it(predicted, measured, noisy, fix, expected):
    assert sb.verdict(predicted, measured, STEP, noisy, fix) == expected


def _row(fix, predicted, measured, verdict, here="meets"):
    return {"fix": fix, "predicted_wall_s": predicted, "measured_wall_s": measured,
            "ratio": predicted / measured if measured > 0 else None,
            "predicted_here_wall_s": predicted, "ratio_here": None,
            "verdict": verdict, "verdict_here": here}  # fmt: skip


def test_the_summary_counts_verdicts_overall_and_by_fix():
    checked = [
        {"file": "loops-h100-1/a.json", "rows": [
            _row("sdpa", 0.002, 0.001, "meets"),
            _row("sdpa", 0.004, 0.001, "misses", here="misses"),
        ]},
        {"file": "loops-h100-1/b.json", "rows": [_row("fused-optimizer", 1e-5, 1e-3, "low")]},
        {"file": "loops-h100-2/c.json", "error": "KeyError: 'x'"},
    ]  # fmt: skip
    s = sb.summary(checked)
    assert s["verdict"] == {"meets": 1, "misses": 1, "low": 1}
    assert s["verdict_here"] == {"meets": 2, "misses": 1}
    assert s["verdict_by_fix"]["sdpa"] == {"meets": 1, "misses": 1}
    # the judged fixes' median |log2 ratio|: 1 (2x) and 2 (4x)
    assert math.isclose(s["median_abs_log2_ratio"], 1.5)
    assert [e["file"] for e in s["errors"]] == ["loops-h100-2/c.json"]
    lines = sb.table(checked)
    assert any("could not be re-predicted" in line for line in lines)
    assert sum("sdpa" in line for line in lines) == 2


def test_every_committed_loop_is_found_and_nothing_else(tmp_path, monkeypatch):
    folder = tmp_path / "loops-h100-3"
    folder.mkdir()
    (folder / "loop-a-eager.json").write_text(
        '{"stages": {"as given": {}}, "fixes": [{"fix": "x"}], "mode": "eager"}'
    )
    (folder / "loop-lib-recheck.json").write_text('{"results": []}')  # a recheck, not a loop
    (folder / "loop-broken.json").write_text("{")
    (tmp_path / "loops-h100-10").mkdir()
    (tmp_path / "loops-h100-10" / "loop-b-compile.json").write_text(
        '{"stages": {"as given": {}}, "fixes": [{"fix": "y"}], "mode": "compile"}'
    )
    monkeypatch.setattr(sb, "RESULTS", tmp_path)
    found = [p.relative_to(tmp_path).as_posix() for p in sb.loop_files("h100")]
    # folders in numeric order (3 before 10), recheck files and unreadable files left out
    assert found == ["loops-h100-3/loop-a-eager.json", "loops-h100-10/loop-b-compile.json"]
