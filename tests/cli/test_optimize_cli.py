"""`gpushape optimize`: the plan that ran, its JSON, and one-line errors for what it cannot do."""

from __future__ import annotations

import json

import pytest

from _chips import H100_DATASHEET
from gpushape.cli.main import main
from gpushape.cli.optimize import parse_size

from .helpers import errors

RESNET = ["optimize", "resnet50", "--batch", "64", "--gpu", "h200", "--train"]  # GPU-bound


def test_prints_the_plan_and_the_predicted_step(capsys):
    assert main(RESNET) == 0
    out = capsys.readouterr().out
    assert "fuse-norm-act" in out and "channels-last" in out
    assert "not checked numerically" in out  # the meta device: rewritten and audited, not run
    before, after = out.split("predicted step: ")[1].split(" ms")[0].split(" -> ")
    assert float(after.replace(",", "")) < float(before.replace(",", ""))


def test_json_report(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main([*RESNET, "--transforms", "channels-last", "-o", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert {c["transform"] for c in doc["applied"]} == {"channels-last"}
    assert doc["predicted_step_after_s"] < doc["predicted_step_before_s"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--transforms", "no-such"], "unknown transform 'no-such'; known:"),
        (["--bench"], "--bench times steps on the GPU: add --device cuda"),
        (["--memory-budget", "lots"], "--memory-budget: cannot read 'lots'"),
        (["-o", "plan.txt"], "-o writes JSON"),
        (["--mode", "compile", "--input", "2x3x64x64"], "--batch does not apply with --input"),
    ],
)
def test_what_it_cannot_do_is_one_line(capsys, extra, says):
    assert says in errors(capsys, [*RESNET, *extra])


def test_memory_budget_plans_recomputation(capsys):
    argv = [*RESNET, "--transforms", "channels-last", "--memory-budget", "40MB"]
    assert main(argv) == 0
    assert "activation-" in capsys.readouterr().out  # (the table may wrap the id)


def test_parse_size():
    assert parse_size("40GB") == 40 * 10**9
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1e9") == 10**9


def test_audit_all_shows_info_findings(capsys):
    argv = ["audit", "resnet50", "--batch", "2", "--gpu", "h200", "--train"]
    assert main(argv) == 0
    quiet = capsys.readouterr().out
    assert main([*argv, "--all"]) == 0
    loud = capsys.readouterr().out
    assert "--all shows them" in quiet and "--all shows them" not in loud
    assert loud.count("info") > quiet.count("info")


def test_bench_times_the_original_against_a_copy_it_optimizes():
    """--bench's measurement itself (the CLI asks for CUDA; the plumbing runs on the CPU)."""
    import argparse

    import torch

    from gpushape.cli.optimize import _bench
    from transforms.nets import ConvNet

    model, inputs = ConvNet(), (torch.randn(2, 3, 16, 16),)
    args = argparse.Namespace(mode="eager")
    # the H100 datasheet: no measured host rates, so the tiny batch is not host-bound
    report, bench = _bench(model, inputs, args, None, H100_DATASHEET, rounds=2, block=1)
    assert {c.transform for c in report.applied} >= {"fuse-norm-act"}
    assert bench["original_ms"] > 0 and bench["optimized_ms"] > 0 and bench["samples"] == 2
    assert not any(type(m).__name__ == "BatchNormAct2d" for m in model.modules())  # a copy


def test_a_transform_kept_on_a_timing_shows_it(capsys):
    """graph-layers is kept by a timing on the GPU, not by the audit: the plan says so."""
    from rich.console import Console

    from gpushape.cli.optimize import render
    from gpushape.models import resolve_model
    from gpushape.transforms import optimize
    from gpushape.transforms._core import Change

    r = resolve_model("resnet50", batch=2)
    _, report = optimize(r.model, r.example_inputs, "h200", transforms=["channels-last"])
    report.applied.append(Change(transform="graph-layers", module="layer1.0", detail="replayed",
                                 undo=lambda: None))  # fmt: skip
    report.measured["graph-layers"] = (0.0517, 0.0289)
    render(report, None, "resnet50", Console(width=200))
    out = capsys.readouterr().out
    assert "timed on this GPU: 51.70 -> 28.90 ms" in out
    assert "checked against eager from one seed" in out
