"""`gpushape probe`: the no-CUDA error, and the whole command end to end on the CPU at toy sizes."""

import json

import pytest
import torch

from gpushape.cli import probe as probe_cli
from gpushape.cli.main import main
from gpushape.hardware import get_gpu, load_profile
from gpushape.probe import plan as probe_plan


def test_without_cuda_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "p.json"
    assert main(["probe", "--quick", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("gpushape: error: ") and "needs a CUDA device" in err
    assert not out.exists()


def test_probe_end_to_end_on_cpu_at_toy_sizes(monkeypatch, capsys, tmp_path):
    # The real command, with the device swapped for the CPU and the plan for the toy one.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # ... and no cuDNN: a CUDA build of torch says it has one, and its version() then checks
    # the devices' capabilities, of which a CPU machine has none (min() of nothing)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    monkeypatch.setattr(probe_cli, "current_gpu", lambda: get_gpu("h200"))
    monkeypatch.setattr(probe_plan, "quick_plan", probe_plan.tiny_plan)
    out, reports = tmp_path / "probe" / "h200.json", tmp_path / "report"
    assert main(["probe", "--quick", "-o", str(out), "--report-dir", str(reports)]) == 0
    stdout = capsys.readouterr().out
    assert "copy bandwidth" in stdout and "guide: conv-channels-63-vs-64" in stdout

    profile = json.loads(out.read_text())
    assert profile["gpu"] == "h200-sxm" and profile["probe"]["mode"] == "tiny"
    assert set(profile["sweeps"]) == {
        "gemm_peak",
        "gemm_align",
        "conv_channels",
        "gemm_batch",
        "conv_batch",
        "wave",
        "optimizer_kernels",
    }
    timed = {k: rows for k, rows in profile["sweeps"].items() if k != "optimizer_kernels"}
    assert all(r["flops_per_s"] > 0 for rows in timed.values() for r in rows)
    # optimizer steps: each implementation's rate and time per tensor, its classes' rates
    # (AdamW's step asks CUDA whether it is capturing, which the patched check above makes it
    # do on a CPU build: an error, reported, and the rows of the classes that ran)
    kernels = dict(profile["optimizer_kernels"])
    errors = kernels.pop("errors", {})
    assert {"foreach", "foreach/SGD"} <= set(kernels), kernels
    assert "foreach/AdamW" in kernels or "foreach/AdamW" in errors
    assert all(0 < r["efficiency"] <= 1 for r in kernels.values())
    assert kernels["foreach"]["tensor_seconds"] >= 0
    assert len(profile["sweeps"]["optimizer_kernels"]) >= 4  # 2 sets x 2 classes, foreach
    assert profile["ceilings"]["copy_bytes_per_s"] > 0
    # where the time went, part by part (the quick probe's budget is kept by these)
    actual = profile["probe"]["timing"]["actual_s"]
    for part in ("ceilings", "host", "module_glue", "memory_efficiency", "optimizer_kernels",
                 "attention"):  # fmt: skip
        assert actual[part] >= 0, part
    assert all("wall_s" in row for row in profile["attention"].values())
    errors = {c["id"]: c["error"] for c in profile["guide_claims"] if "error" in c}
    assert not errors  # every claim's measurement ran (and its two variants agreed)
    assert 0.01 <= profile["conv_small_cin"]["efficiency"] <= 1
    memory = profile["memory_efficiency"]
    # nchw_conversion has no efficiency when NCHW ran no slower than channels_last, which CPU
    # timings at toy sizes can show (probe/convs.py); every other family has one
    # norm_weight_grad is against an SM's share of the copy rate: one SM may draw more (to 4)
    failed = {
        f: r
        for f, r in memory.items()
        if not 0.01 <= (r.get("efficiency") or 0) <= (4 if f == "norm_weight_grad" else 1)
        and not (f == "nchw_conversion" and r.get("efficiency") is None and "error" not in r)
    }
    assert memory and not failed, failed
    spec = load_profile(out)  # the written profile reads back through the hardware layer
    assert spec.name == "h200-sxm" and "memory_bandwidth_fraction" in spec.achievable.measured
    assert set(spec.achievable.memory_efficiency) == {
        f for f, r in memory.items() if r.get("efficiency") is not None
    }
    assert spec.achievable.source.startswith("measured")
    assert spec.achievable.optimizer_kernels["foreach"] == kernels["foreach"]["efficiency"]

    md = (reports / "probe-report.md").read_text()
    assert "## The guide's rules of thumb on this GPU" in md
    assert "## Eager kernels against the copy rate" in md
    for png in sorted((reports / "plots").glob("*.png")):
        assert f"plots/{png.name}" in md and png.stat().st_size > 1000


@pytest.mark.gpu
def test_quick_probe_on_the_gpu(tmp_path):
    out = tmp_path / "profile.json"
    assert main(["probe", "--quick", "-o", str(out)]) == 0
    profile = json.loads(out.read_text())
    assert profile["probe"]["timing"]["total_s"] < 90, profile["probe"]["timing"]["actual_s"]
    # the kernels' names are a record the full probe keeps; listing them costs the quick one
    assert not any("kernels" in row for row in profile["attention"].values())
    assert profile["tc_align_elems"]["bf16"] in (8, 16)
    spec = load_profile(out)
    assert 0.5 < spec.achievable.memory_bandwidth_fraction <= 1.05
