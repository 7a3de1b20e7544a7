"""`bench --loss-steps`: each variant trained from the same weights, its loss curve against
the baseline's; a variant that trains slower, stalls or diverges is told apart from one that
only rounds differently."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gpushape.cli.main import main
from gpushape.errors import GpushapeError
from gpushape.steps import bench, build_step, synthetic_batch
from gpushape.steps.loss_check import LossCurve, compare, loss_curves, record_curve
from gpushape.steps.variants import Spec
from transforms.nets import ConvNet

FAST = dict(rounds=1, block=1, warmup=1)
FALLING = tuple(4.0 * 0.7**i for i in range(12))
BASE = LossCurve("eager", FALLING)


def verdict_of(other: LossCurve, base: LossCurve = BASE) -> str:
    return compare({"eager": base, other.variant: other}, "eager")[other.variant].verdict


def test_the_same_curve_within_rounding_tracks_the_baseline():
    wobbly = tuple(x * (1 + 0.01 * (-1) ** i) for i, x in enumerate(FALLING))
    v = compare({"eager": LossCurve("eager", FALLING), "x": LossCurve("x", wobbly)}, "eager")
    assert v["eager"].verdict == "baseline" and v["x"].verdict == "tracks"
    assert v["x"].mean_gap < 0.01 and v["x"].final_gap < 0.01


def test_a_curve_that_ends_level_but_falls_slower_differs():
    slow = tuple(4.0 * 0.85**i for i in range(10)) + FALLING[-2:]  # late catch-up
    v = compare({"eager": LossCurve("eager", FALLING), "x": LossCurve("x", slow)}, "eager")["x"]
    assert v.final_gap < 0.1 < v.mean_gap and v.verdict == "differs"


def test_a_stalled_curve_differs_and_a_nan_diverges():
    assert verdict_of(LossCurve("x", (4.0,) * 12)) == "differs"
    assert verdict_of(LossCurve("x", FALLING[:5] + (math.nan,) * 7)) == "diverged"


def test_a_baseline_that_did_not_fall_leaves_nothing_to_compare():
    flat = LossCurve("eager", (4.0, 3.99) * 6)
    assert verdict_of(LossCurve("x", FALLING), base=flat) == "flat"


def test_a_graph_curve_that_starts_after_its_warm_up_is_aligned_step_for_step():
    later = LossCurve("graph", FALLING[3:], start=3)
    assert later.at(3) == FALLING[3] and later.at(2) is None
    assert verdict_of(later) == "tracks"
    unaligned = LossCurve("graph", FALLING[3:], start=0)  # the same losses read from step 0
    assert verdict_of(unaligned) == "differs"


def test_a_step_that_does_not_learn_is_told_apart_from_one_that_does():
    torch.manual_seed(0)
    model, inputs = ConvNet(), (torch.randn(4, 3, 16, 16),)
    batch = synthetic_batch(model, inputs)
    curves = {}
    for name, lr in (("eager", 0.05), ("frozen", 0.0)):
        torch.manual_seed(1)
        m = ConvNet()
        step = build_step(m, batch, "sgd")
        for group in step.optimizer.param_groups:
            group["lr"] = lr
        curves[name] = record_curve(step, 12, name)
    verdicts = compare(curves, "eager")
    assert curves["eager"].end() < 0.5 * curves["eager"].losses[0]  # the batch is learnt
    assert verdicts["frozen"].verdict == "differs"


def test_variants_are_built_from_the_same_weights_and_checked():
    torch.manual_seed(0)
    model, inputs = ConvNet(), (torch.randn(4, 3, 16, 16),)
    batch = synthetic_batch(model, inputs)
    specs = {v: Spec.of(v) for v in ("eager", "channels-last", "graph")}
    curves, failed = loss_curves(specs, model, batch, steps=8, optimizer="sgd", gpu="h200")
    assert set(curves) == {"eager", "channels-last"} and "graph" in failed  # no CUDA here
    assert curves["eager"].losses[0] == pytest.approx(curves["channels-last"].losses[0], rel=1e-4)
    assert compare(curves, "eager")["channels-last"].verdict == "tracks"
    with pytest.raises(GpushapeError, match="at least 6"):
        loss_curves(specs, model, batch, steps=3, optimizer="sgd", gpu="h200")


def test_bench_keeps_the_curves_and_their_verdicts():
    torch.manual_seed(0)
    result = bench(ConvNet(), (torch.randn(4, 3, 16, 16),), variants=["channels-last"],
                   gpu="h200", loss_steps=8, optimizer="sgd", **FAST)  # fmt: skip
    doc = result.to_dict()["loss_check"]
    assert doc["steps"] == 8 and len(doc["curves"]["eager"]["losses"]) == 8
    assert doc["verdicts"]["channels-last"]["verdict"] == "tracks"
    assert "loss_check" not in bench(ConvNet(), (torch.randn(2, 3, 8, 8),), **FAST).to_dict()


def test_the_command_line_prints_writes_and_plots_the_check(tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    args = ["bench", "resnet50", "--device", "cpu", "--dtype", "fp32", "--input", "4x3x32x32",
            "--rounds", "1", "--steps", "1", "--warmup", "1", "--vs", "channels-last",
            "--loss-steps", "6", "-o", str(out), "--plot", str(plot)]  # fmt: skip
    code = main(args)
    assert code == 0
    printed = capsys.readouterr().out
    assert "loss over 6 steps from the same weights" in printed
    assert "channels-last:" in printed and "the baseline" in printed
    assert json.loads(out.read_text())["loss_check"]["steps"] == 6
    assert plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--optimize", "--loss-steps", "10"], "drop --optimize"),
        (["--loss-steps", "5"], "--loss-steps must be at least 6, got 5"),
        (["--nproc", "2", "--loss-steps", "10"], "drop --loss-steps"),
    ],
)
def test_loss_steps_errors_are_one_line(extra, says, capsys):
    assert main(["bench", "resnet50", "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
