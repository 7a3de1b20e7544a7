"""A measured profile replaces datasheet numbers: the H200's shipped profile by default,
--profile FILE when given, the datasheet with --no-profile; reports and findings say which."""

from __future__ import annotations

import json

import pytest

import gpushape.hardware.profile as profile_module
from gpushape.auditing import audit
from gpushape.cli.main import main

from .cases import build, meta
from .models import ManyTiny

MEASURED = {
    "format": "gpushape-profile",
    "version": 1,
    "gpu": "h200-sxm",
    "device_name": "NVIDIA H200",
    "measured_at": "2026-11-30T07:00:00Z",
    "ceilings": {
        "copy_bytes_per_s": 4.0e12,
        "launch_overhead_s": 9.0e-6,
        "graph_launch_overhead_s": 1.0e-6,
    },
    "tc_align_elems": {"bf16": 8},
}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A profile shipped for the H200 (in a temporary profiles folder)."""
    (tmp_path / "h200-sxm.json").write_text(json.dumps(MEASURED))
    monkeypatch.setattr(profile_module, "PROFILES_DIR", tmp_path)
    return tmp_path / "h200-sxm.json"


def _launch(report):
    (f,) = [f for f in report.findings if f.rule == "launch-bound"]
    return f


def test_h200_uses_the_shipped_profile_and_says_so(shipped):
    model, inputs = build(ManyTiny), (meta(16, 64),)
    report = audit(model, inputs, gpu="h200", rules=["launch-bound"])
    assert report.calibration and "h200-sxm.json" in report.calibration
    f = _launch(report)
    assert f.evidence["launch_overhead_s"] == MEASURED["ceilings"]["launch_overhead_s"]
    assert f.evidence["numbers"].startswith("calibrated by measurement")
    datasheet = audit(model, inputs, gpu="h200", profile=None, rules=["launch-bound"])
    assert datasheet.calibration is None
    assert _launch(datasheet).evidence["numbers"].startswith("datasheet")


def test_other_chips_keep_the_datasheet(shipped):
    report = audit(build(ManyTiny), (meta(16, 64),), gpu="h100", rules=["launch-bound"])
    assert report.calibration is None


def test_cli_profile_flags(shipped, tmp_path, capsys):
    argv = ["audit", "resnet50", "--batch", "2", "--gpu", "h200", "--format", "md"]
    assert main(argv) == 0
    assert "calibrated by measurement: bundled profile h200-sxm.json" in capsys.readouterr().out
    assert main([*argv, "--no-profile"]) == 0
    assert "datasheet numbers" in capsys.readouterr().out
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({**MEASURED, "ceilings": {"launch_overhead_s": 2e-5}}))
    assert (
        main(["audit", "resnet50", "--batch", "2", "--profile", str(own), "--format", "json"]) == 0
    )  # --gpu defaults to the profile's chip
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"] == "h200-sxm"
    assert all("mine.json" in f["evidence"]["numbers"] for f in doc["findings"])


def test_profile_for_another_chip_is_refused(shipped, capsys):
    assert main(["audit", "resnet50", "--gpu", "h100", "--profile", str(shipped)]) == 2
    err = capsys.readouterr().err.strip()
    assert "measured on h200-sxm, not h100-sxm" in err and "\n" not in err


def test_a_probe_that_found_no_wave_quantization_keeps_the_rule_at_info(tmp_path):
    """The model predicts wave quantization for this GEMM (tests/auditing/cases.py); a profile
    whose probe measured no such pattern on the chip outranks it."""
    from gpushape.auditing.finding import Severity

    from .models import OneLinear

    model, inputs = build(OneLinear, 504, 1856), (meta(2432, 504),)
    h100 = {**MEASURED, "gpu": "h100-sxm"}
    found = tmp_path / "found.json"
    found.write_text(json.dumps({**h100, "wave_quantization": {"found": True}}))
    absent = tmp_path / "absent.json"
    absent.write_text(
        json.dumps(
            {
                **h100,
                "wave_quantization": {
                    "found": False,
                    "evidence": "no clear wave-quantization pattern",
                },
            }
        )
    )
    kwargs = {"gpu": "h100", "train": False, "rules": ["wave-quantization"]}
    (loud,) = audit(model, inputs, profile=found, **kwargs).findings
    (quiet,) = audit(model, inputs, profile=absent, **kwargs).findings
    assert loud.severity > Severity.INFO
    assert quiet.severity == Severity.INFO and "no clear" in quiet.evidence["probe"]
