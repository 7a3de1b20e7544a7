"""What `gpushape audit` prints: the format an -o extension names, the findings that failed
--fail-on, user text never read as markup or emoji, and a header that says what was audited,
on which chip and why that chip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpushape
import gpushape.auditing.target as target_mod
from gpushape.auditing import api
from gpushape.auditing.report.header import describe_inputs
from gpushape.auditing.target import resolve_target
from gpushape.cli.main import main
from gpushape.errors import UnknownGPUError
from gpushape.hardware import get_gpu
from gpushape.hardware.profile import bundled_profile_path

from .helpers import fails


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(target_mod, "current_gpu", lambda: None)


@pytest.fixture
def h200_here(monkeypatch):
    monkeypatch.setattr(target_mod, "current_gpu", lambda: get_gpu("h200"))


# --- -o picks the format ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "starts"),
    [
        ("r.html", "<!DOCTYPE html>"),
        ("r.HTM", "<!DOCTYPE html>"),
        ("r.json", '{\n "schema": 1'),
        ("r.md", "# gpushape audit: "),
        ("r.txt", "nets.py:tiny, batch 2"),
        ("report", "nets.py:tiny, batch 2"),
    ],
)
def test_output_extension_picks_the_format(capsys, nets, tmp_path, name, starts):
    out = tmp_path / name
    assert main(["audit", f"{nets}:tiny", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith(starts if starts[0] in "<{#" else f"{nets}:tiny") and starts in text
    assert "\x1b[" not in text  # no colour codes in a file
    assert capsys.readouterr().err == f"gpushape: wrote {out}\n"


def test_an_explicit_format_that_agrees_or_a_neutral_extension(capsys, nets, tmp_path):
    assert main(["audit", f"{nets}:tiny", "--format", "json", "-o", str(tmp_path / "r.txt")]) == 0
    assert json.loads((tmp_path / "r.txt").read_text())["schema"] == 1
    assert main(["audit", f"{nets}:tiny", "--format", "md", "-o", str(tmp_path / "r.md")]) == 0
    capsys.readouterr()


# --- --fail-on names what failed -------------------------------------------------------------


def test_fail_on_names_the_failing_findings(capsys, nets):
    assert main(["audit", f"{nets}:vocab", "--format", "json", "--fail-on", "medium"]) == 1
    captured = capsys.readouterr()
    failing = [
        f for f in json.loads(captured.out)["findings"] if f["severity"] in ("high", "medium")
    ]
    line = captured.err.strip()
    assert "\n" not in line
    noun = "finding" if len(failing) == 1 else "findings"
    assert line.startswith(f"gpushape: {len(failing)} {noun} at or above medium (--fail-on): ")
    for f in failing:
        assert f"{f['rule']}@{f['module'] or '(model)'} ({f['severity']}, " in line
    assert "tc-align@head (high, " in line and " ms)" in line


def test_no_failing_finding_no_line(capsys, nets, tmp_path):
    clean = tmp_path / "clean.py"
    clean.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def make():\n    return nn.Linear(4096, 4096), (torch.randn(8192, 4096),)\n"
    )
    assert main(["audit", f"{clean}:make", "--fail-on", "medium"]) == 0
    assert capsys.readouterr().err == ""


# --- user text is text -----------------------------------------------------------------------


def test_model_spec_is_not_an_emoji(capsys, tmp_path, monkeypatch):
    """`hf.py:llama` once rendered as 'hf.py🦙' in the table's title."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def llama():\n    return nn.Linear(64, 64), (torch.randn(4, 64),)\n"
    )
    assert main(["audit", "hf.py:llama"]) == 0
    out = capsys.readouterr().out
    assert "\U0001f999" not in out
    assert out.startswith("hf.py:llama, input 4x64,") and "hf.py:llama: forward on" in out


def test_module_names_and_paths_are_not_markup(capsys, nets, tmp_path, monkeypatch):
    folder = tmp_path / "[bold]runs"
    folder.mkdir()
    (folder / "nets.py").write_text(Path(nets).read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "[bold]runs/nets.py:bracketed"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[bold]runs/nets.py:bracketed, input 4x64")  # the headline
    assert "[bold]runs/nets.py:bracketed: forward on" in out  # the table's title
    assert "│ [red]x " in out  # the module's row


# --- which GPU, and why ----------------------------------------------------------------------


def _headline(capsys, argv: list[str]) -> list[str]:
    assert main([*argv, "--format", "md"]) == 0
    return capsys.readouterr().out.splitlines()[2:4]


def test_default_without_a_gpu_is_h100_and_says_so(capsys, nets, no_gpu):
    first, second = _headline(capsys, ["audit", f"{nets}:tiny"])
    assert first.endswith(
        "on NVIDIA H100 SXM5 80GB (h100-sxm, default: no CUDA GPU here; pass --gpu)  "
    )
    assert second.endswith("; calibrated by measurement: bundled profile h100-sxm.json")
    assert "ms predicted (eager: host-bound, " in second  # a tiny model, the measured host
    _, second = _headline(capsys, ["audit", f"{nets}:tiny", "--no-profile"])
    assert "ms predicted (eager: " in second and second.endswith("; datasheet numbers")
    # the datasheet has no measured idle time between kernels: the step is priced as kernels
    # and launches in series, and the header says that, not which side binds (the sum it
    # prints would contradict "GPU-bound")
    assert "ms of launches, not overlapped)" in second and "-bound" not in second


def test_default_is_the_gpu_present_with_its_profile(capsys, nets, h200_here):
    first, second = _headline(capsys, ["audit", f"{nets}:tiny"])
    assert "(h200-sxm, the GPU present)" in first
    assert "calibrated by measurement: bundled profile h200-sxm.json" in second


def test_a_gpu_the_catalog_lacks_falls_back_to_h100(capsys, nets, monkeypatch):
    def unknown():
        raise UnknownGPUError("unknown GPU 'NVIDIA X1'")

    monkeypatch.setattr(target_mod, "current_gpu", unknown)
    first, _ = _headline(capsys, ["audit", f"{nets}:tiny"])
    assert "(h100-sxm, default: the GPU present is not in the catalog; pass --gpu)" in first


def test_named_gpu_and_profile_chip(capsys, nets, h200_here):
    first, _ = _headline(capsys, ["audit", f"{nets}:tiny", "--gpu", "a100"])
    assert "(a100-80gb, from --gpu)" in first
    profile = str(bundled_profile_path("h200"))
    first, second = _headline(capsys, ["audit", f"{nets}:tiny", "--profile", profile])
    assert "(h200-sxm, the chip the profile was measured on)" in first
    assert f"calibrated by measurement: profile {profile}" in second


def test_api_default_is_the_cli_default(h200_here):
    import torch
    from torch import nn

    model, inputs = nn.Linear(64, 64, device="meta"), (torch.empty(4, 64, device="meta"),)
    for report in (gpushape.audit(model, inputs), api.audit(model, inputs)):
        assert (report.gpu, report.gpu_reason) == ("h200-sxm", "the GPU present")
        assert report.calibration == "bundled profile h200-sxm.json"
    assert resolve_target("h100").reason == "from gpu=..."
    assert resolve_target(None, None).spec.name == "h200-sxm"


def test_json_keeps_schema_1_keys(capsys, nets, no_gpu):
    assert main(["audit", f"{nets}:tiny", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"schema", "model", "gpu", "dtype", "train", "totals", "layers", "findings"} <= set(doc)
    assert not {"gpu_reason", "inputs", "target_reason"} & set(doc)


# --- what was audited ------------------------------------------------------------------------


def test_header_says_inputs_dtype_and_step(capsys, nets, no_gpu):
    first, _ = _headline(capsys, ["audit", f"{nets}:tiny", "--train", "--dtype", "fp16"])
    assert first.startswith(f"{nets}:tiny, batch 2, 3x8x8 images, fp16, training step, on ")
    first, _ = _headline(capsys, ["audit", f"{nets}:tokens"])
    assert first.startswith(f"{nets}:tokens, batch 2, sequence 16, bf16, forward, on ")
    first, _ = _headline(capsys, ["audit", "resnet50", "--batch", "3"])
    assert first.startswith("resnet50, batch 3, 3x224x224 images, bf16, forward, on ")


def test_describe_inputs():
    import torch

    meta = {"device": "meta"}
    assert describe_inputs(torch.empty(8, 3, 32, 32, **meta)) == "batch 8, 3x32x32 images"
    ids = torch.empty(4, 512, dtype=torch.long, **meta)
    assert describe_inputs({"input_ids": ids}) == "batch 4, sequence 512"
    mask = torch.empty(4, 16, dtype=torch.bool, **meta)
    seq = torch.empty(4, 16, 64, **meta)
    assert describe_inputs((seq, mask)) == "inputs 4x16x64, 4x16"
    assert describe_inputs([mask] * 5) == "inputs 4x16, 4x16, 4x16 +2 more"
    assert describe_inputs(()) is None and describe_inputs(3) is None


def test_one_line_errors_still_hold_for_the_header_options(capsys, nets):
    line = fails(capsys, ["audit", f"{nets}:tiny", "--gpu", "h300"])
    assert line.startswith("gpushape: error: unknown GPU 'h300'")
