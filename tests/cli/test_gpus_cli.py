import json
import subprocess
import sys

import pytest

from gpushape.cli.main import main


def test_catalog_table(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    for name in ("h100-sxm", "h200-sxm", "b200", "v100-sxm2"):
        assert name in out


def test_catalog_json(capsys):
    assert main(["gpus", "--json"]) == 0
    chips = json.loads(capsys.readouterr().out)
    assert len(chips) >= 12
    h200 = next(c for c in chips if c["name"] == "h200-sxm")
    assert h200["memory_bandwidth_bytes_per_s"] == 4.8e12
    assert abs(h200["tensor_core_flops"]["bf16"] - 989e12) / 989e12 < 0.01
    for field in (
        "sm_count",
        "tensor_core_flops",
        "cuda_core_flops",
        "memory_bytes",
        "l2_bytes",
        "sm_limits",
        "tc_align_elems",
        "nvlink_bandwidth_bytes_per_s",
        "pcie_bandwidth_bytes_per_s",
        "current",
    ):
        assert field in h200


def test_one_chip(capsys):
    assert main(["gpus", "nvidia h200"]) == 0
    out = capsys.readouterr().out
    assert "H200" in out and "132" in out and "4.80 TB/s" in out


def test_one_chip_json(capsys):
    assert main(["gpus", "H100-SXM5-80GB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "h100-sxm"


def test_unknown_chip_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "gpushape.cli.main", "gpus", "nosuchchip"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown GPU 'nosuchchip'" in lines[0] and "h200-sxm" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.gpu
def test_marks_the_current_device(capsys):
    import torch

    assert main(["gpus", "--json"]) == 0
    chips = json.loads(capsys.readouterr().out)
    current = [c for c in chips if c["current"]]
    assert len(current) == 1
    props = torch.cuda.get_device_properties(0)
    assert current[0]["sm_count"] == props.multi_processor_count
