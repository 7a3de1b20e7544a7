"""benchmarks/data/bench_input_pipeline.py --smoke runs end to end on the CPU (~15 s)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "bench_input_pipeline.py"


@pytest.mark.slow
def test_smoke_run_writes_rows_and_criteria(tmp_path):
    out = tmp_path / "result.json"
    args = [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)]
    done = subprocess.run(
        [*args, "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["environment"]["command"] and "torch" in result["environment"]
    rows = {row["variant"]: row for row in result["results"]}
    assert set(rows) == {"synthetic", "prefetch", "naive", "shard"}
    assert all(row["steps"] >= 1 and row["img_per_s"] > 0 for row in rows.values())
    assert rows["synthetic"]["fraction_of_synthetic"] == 1.0
    assert rows["prefetch"]["loader"]["batch_size"] == 4
    assert {c["verdict"] for c in result["criteria"]} <= {"PASS", "FAIL", "SKIPPED"}
    assert "PASS" in done.stdout or "FAIL" in done.stdout  # the table is printed last


def test_without_cuda_and_without_smoke_it_says_what_to_do(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--smoke" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
