"""`gpushape bench --nproc N`: DDP through the real torchrun launcher on the CPU (gloo), the
figures rank 0 reports, the command the workers rerun, and the options that contradict it."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.helpers import errors
from gpushape.cli import bench as bench_cli
from gpushape.cli.main import build_parser
from gpushape.steps import distributed, results
from gpushape.steps.distributed import DDPResult, worker_argv
from gpushape.steps.measure import StepStats

SRC = Path(__file__).resolve().parents[2] / "src"
FACTORY = """
import torch
from torch import nn


def tiny():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), (torch.zeros(4, 16),)
"""
PARAM_BYTES = (16 * 32 + 32 + 32 * 4 + 4) * 4  # the tiny model's fp32 gradients
FAST = ["--device", "cpu", "--dtype", "fp32", "--rounds", "1", "--steps", "1", "--warmup", "1"]


@pytest.fixture
def tiny(tmp_path) -> str:
    path = tmp_path / "tiny.py"
    path.write_text(FACTORY)
    return f"{path}:tiny"


def gpushape_bench(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "gpushape", "bench", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    if done.returncode and ABORT in done.stderr:  # once more, and only for gloo's abort
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    return done


# On a loaded 2-core CI machine with torch 2.14.1, a gloo rank once aborted in C++ with this
# line and no Python error (1 run in about 12; not reproduced in 11 runs under load since):
# a native thread torn down while joinable. It says nothing about gpushape's DDP timing, so a
# run that fails with exactly that is run once more; any other failure fails the test.
ABORT = "terminate called without an active exception"


@pytest.mark.slow
def test_two_ranks_under_torchrun(tiny, tmp_path):
    table, out = tmp_path / "ddp.csv", tmp_path / "ddp.json"
    done = gpushape_bench(tiny, *FAST, "--nproc", "2", "--csv", str(table), "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scaling efficiency" in done.stdout and "all 2" in done.stdout
    assert done.stderr.count("timing alone and DDP") == 1  # rank 0 alone speaks
    rows = list(csv.DictReader(table.open()))
    assert [r["variant"] for r in rows] == ["alone", "ddp x2"]
    assert rows[0]["speedup_vs_baseline"] == "1.000"
    assert float(rows[1]["speedup_vs_baseline"]) > 0
    assert "scaling efficiency" in rows[1]["notes"] and "gloo" in rows[1]["notes"]
    assert rows[1]["command"].startswith("gpushape bench ") and "--nproc" in rows[1]["command"]
    doc = json.loads(out.read_text())
    assert doc["world"] == 2 and doc["backend"] == "gloo" and len(doc["ranks"]) == 2
    assert doc["grad_bytes"] == doc["wire_bytes"] == PARAM_BYTES
    assert doc["scaling_efficiency"] == pytest.approx(
        doc["variants"]["ddp x2"]["speedup_vs_baseline"]
    )
    # the bucket size tuned by default: every size timed, the fastest reported
    assert set(doc["bucket_sweep"]) == {"10", "25", "50", "100"}
    assert doc["scaling_efficiency"] == pytest.approx(max(doc["bucket_sweep"].values()))
    assert doc["bucket_mb"] in (10, 25, 50, 100) and "bucket size tuned" in done.stdout


@pytest.mark.slow
def test_bf16_compression_halves_the_bytes(tiny, tmp_path):
    out = tmp_path / "ddp.json"
    done = gpushape_bench(tiny, *FAST, "--nproc", "2", "--ddp-compress", "bf16",
                          "--bucket-mb", "50", "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "link-bound" in done.stdout and "not over NVLink" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["compress"] == "bf16" and doc["wire_bytes"] * 2 == doc["grad_bytes"]
    assert doc["bucket_mb"] == 50 and list(doc["bucket_sweep"]) == ["50"]  # as given
    assert "bucket size tuned" not in done.stdout


def test_workers_rerun_the_same_command():
    argv = ["bench", "m.py:f", "--device", "cpu", "--input", "2x16", "--input", "2x16:int64",
            "--nproc", "2", "--bucket-mb", "50", "--ddp-compress", "bf16", "--debug"]  # fmt: skip
    args = build_parser().parse_args(argv)
    rebuilt = bench_cli._argv(args)
    again = build_parser().parse_args(rebuilt)
    del args.bench_parser, again.bench_parser  # each parse has its own parser
    assert vars(again) == vars(args)
    worker = worker_argv(rebuilt)
    assert worker[-1] == "--ddp-worker" and not any(a.startswith("--nproc") for a in worker)
    assert worker_argv(["bench", "x", "--nproc", "4"]) == ["bench", "x", "--ddp-worker"]


def test_a_workers_error_line_ends_the_relay(capsys):
    lines = iter(["gpushape: building\n", "gpushape: error: boom\n", "Traceback ...\n", "x\n"])
    assert distributed._relay(lines) is True
    assert capsys.readouterr().err == "gpushape: building\ngpushape: error: boom\n"
    assert next(lines, None) is None  # drained: torchrun never blocks on the pipe
    assert distributed._relay(io.StringIO("W torchrun chatter\n")) is False
    capsys.readouterr()
    two = "gpushape: error: no file x.pygpushape: error: no file x.py\n"  # two ranks, one line
    assert distributed._relay(iter([two])) is True
    assert capsys.readouterr().err == "gpushape: error: no file x.py\n"


def stats(times: tuple[float, ...]) -> StepStats:
    return StepStats(variant="x", step_times_s=times, warmup_s=0.5, samples=8, tokens=0)


def test_efficiency_is_the_step_alone_over_the_slowest_ranks_ddp_step():
    result = DDPResult(model="m", task="t", batch_shapes=["8x16:float32"], backend="nccl",
                       bucket_mb=25, compress="bf16", grad_bytes=400, wire_bytes=200,
                       single=[stats((0.10, 0.10)), stats((0.10, 0.12))],
                       ddp=[stats((0.104,)), stats((0.105,))])  # fmt: skip
    assert result.alone.median_s == pytest.approx(0.10)
    assert result.total.median_s == pytest.approx(0.105) and result.total.samples == 16
    assert result.efficiency == pytest.approx(0.10 / 0.105)
    assert result.total.samples_per_s == pytest.approx(16 / 0.105)
    rows = {r["variant"]: r for r in results.bench_rows(result.as_bench())}
    assert rows["ddp x2"]["speedup_vs_baseline"] == f"{0.10 / 0.105:.3f}"
    assert any("not over NVLink" in n for n in result.notes())


def test_auto_buckets_keep_the_size_whose_slowest_rank_is_fastest():
    sweep = {10.0: [stats((0.110,)), stats((0.112,))], 25.0: [stats((0.104,)), stats((0.106,))],
             50.0: [stats((0.103,)), stats((0.108,))]}  # fmt: skip
    result = DDPResult(model="m", task="t", batch_shapes=["8x16:float32"], backend="nccl",
                       bucket_mb=25, compress=None, grad_bytes=400, wire_bytes=400,
                       single=[stats((0.10,)), stats((0.10,))], ddp=sweep[25.0],
                       sweep=sweep)  # fmt: skip
    effs = result.sweep_efficiency()
    assert max(effs, key=effs.get) == 25.0 and effs[25.0] == pytest.approx(result.efficiency)
    assert any(n.startswith("bucket size tuned: the fastest of 10 MB") for n in result.notes())
    assert result.to_dict()["bucket_sweep"]["50"] == pytest.approx(0.10 / 0.108)


def test_bucket_mb_takes_a_size_or_auto(capsys):
    args = build_parser().parse_args(["bench", "x", "--nproc", "2", "--bucket-mb", "50"])
    assert args.bucket_mb == 50.0
    assert build_parser().parse_args(["bench", "x"]).bucket_mb == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "x", "--bucket-mb", "big"])
    assert "a size in MB or auto, not 'big'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--nproc", "2", "--optimize"], "drop --optimize, or run it without --nproc"),
        (["--nproc", "2", "--vs", "compile"], "drop --vs"),
        (["--nproc", "2", "--plot", "p.png"], "drop --plot"),
        (["--nproc", "0"], "--nproc must be at least 1"),
        (["--nproc", "2", "--bucket-mb", "0"], "--bucket-mb must be above 0"),
        (["--ddp-compress", "bf16"], "apply to DDP: add --nproc N"),
        (["--ddp-worker", "--nproc", "2"], "drop --nproc"),
    ],
)
def test_one_line_errors(capsys, extra, says):
    assert says in errors(capsys, ["bench", "resnet50", "--device", "cpu", *extra])


def test_more_processes_than_gpus(capsys):
    assert "--nproc 999 needs 999 GPUs" in errors(capsys, ["bench", "resnet50", "--nproc", "999"])


def test_a_worker_outside_torchrun(capsys, monkeypatch, tiny):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert "runs as one rank under torchrun" in errors(
        capsys, ["bench", tiny, *FAST, "--ddp-worker"]
    )
