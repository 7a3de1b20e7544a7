"""benchmarks/hardware/host_class_rates.py: without a GPU it stops with one line; on one, the
classes' rows (forward and backward) are merged into the profile's host rates, and nothing
else (that part runs on the GPU machine: pytest -m gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "hardware" / "host_class_rates.py"
SHIPPED = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU lane")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    done = _run("--profile", str(SHIPPED), "--classes", "gpushape_group_norm",
                "-o", str(tmp_path / "p.json"))  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "host_class_rates.py: needs a CUDA GPU"
    assert not (tmp_path / "p.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_classes_rows_are_merged_and_nothing_else(tmp_path):
    from gpushape.hardware.lookup import current_gpu

    spec = current_gpu()
    src = ROOT / "src" / "gpushape" / "hardware" / "profiles" / f"{spec.name}.json"
    if not src.exists():  # the H100's profile is a committed result, not shipped
        src = ROOT / "benchmarks" / "results" / "probe-h100" / f"{spec.name}.json"
    if not src.exists():
        pytest.skip(f"no shipped profile for {spec.name}")
    out = tmp_path / "p.json"
    done = _run("--profile", str(src), "--classes", "gpushape_group_norm", "-o", str(out))
    assert done.returncode == 0, done.stderr
    before, after = json.loads(src.read_text()), json.loads(out.read_text())
    added = set(after["host"]) - set(before["host"])
    assert added <= {"gpushape_group_norm", "gpushape_group_norm/backward"}
    assert after["host"]["gpushape_group_norm"]["seconds"] > 0
    for key, row in before["host"].items():
        if not key.startswith("gpushape_group_norm"):
            assert after["host"][key] == row, key
