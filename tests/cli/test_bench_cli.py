"""`gpushape bench`: the table, the CSV it appends, the plot, and one-line errors."""

from __future__ import annotations

import csv
import json

import pytest

from gpushape.cli.main import main

from .helpers import errors

CPU = ["bench", "resnet50", "--device", "cpu", "--dtype", "fp32",
       "--rounds", "1", "--steps", "1", "--warmup", "1", "--input", "2x3x64x64"]  # fmt: skip


def test_table_csv_plot_and_json(tmp_path, capsys):
    table = tmp_path / "bench.csv"
    argv = [*CPU, "--vs", "channels-last", "--csv", str(table), "--plot", str(tmp_path / "p.png")]
    assert main([*argv, "-o", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr()
    assert "channels-last" in out.out and "samples/s" in out.out
    assert "say nothing about a GPU" in out.err
    rows = list(csv.DictReader(table.open()))
    assert [r["variant"] for r in rows] == ["eager", "channels-last"]
    assert rows[0]["speedup_vs_baseline"] == "1.000" and rows[0]["command"]
    assert (tmp_path / "p.png").stat().st_size > 1000
    doc = json.loads((tmp_path / "r.json").read_text())
    assert set(doc["variants"]) == {"eager", "channels-last"}
    assert main(argv) == 0  # a second run appends, with no second header
    assert len(list(csv.DictReader(table.open()))) == 4


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--vs", "warp-speed"], "unknown variant 'warp-speed'"),
        (["--optimize", "--vs", "compile"], "--optimize measures the fixes one by one"),
        (["--optimize", "--mode", "graph"], "--optimize runs in --mode eager or compile"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--plot", "p.txt"], "--plot writes an image"),
        (["-o", "r.txt"], "-o writes JSON"),
    ],
)
def test_one_line_errors(capsys, extra, says):
    assert says in errors(capsys, [*CPU, *extra])


def test_meta_device_is_refused(capsys):
    argv = [a if a != "cpu" else "meta" for a in CPU]
    assert "bench runs the model" in errors(capsys, argv)


def test_no_gpu_says_what_bench_needs(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [a if a != "cpu" else "cuda" for a in CPU]
    err = errors(capsys, argv)
    assert err.startswith("bench times the training step on a GPU") and "gpushape audit" in err
