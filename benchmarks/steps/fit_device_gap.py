"""Fit how long the GPU idles between kernels of a step the host keeps fed, from the training
steps timed on one GPU kind (`gpushape bench` variants and fix-by-fix loop stages), on this
machine.

Each timed step records its median wall clock, its kernels' busy time (the sum of their
durations in a profiled step) and its kernel count. Where the host issued the step well ahead
of the GPU (its issue time from an idle GPU under `BOUND` of the busy time), nothing but the
GPU set the pace, yet the wall clock still exceeds the busy time: the GPU idles from one
kernel's end to the next one's start, and around the memory operations between them. That
idle time a kernel is fitted here by how the step runs ("eager", "compile", "graph": the
whole step replayed from one CUDA graph, "compile-graphs": torch.compile's CUDA graphs), as
the median over the steps of that kind. Stages that replay only the layers from graphs
(graph-layers) and `optimize` variants (which may keep graph-layers) are mixed and left out.

Kernels are not all the idle time follows. On the H100 a compiled step idled 1.1-1.4 ms
whatever its kernels (274 to 831 of them, five models): a time a step (the host's stretches
without a launch, longer than the queue's lead) more than a time a kernel. So each kind is
fitted two ways, a median gap a kernel and a line (a time a step plus a gap a kernel, least
squares, neither negative), and the line is kept only where it predicts each model's steps
from the other models' clearly better (`held_out_error_s`, the median absolute error of idle
time a step, a tenth below the gap a kernel's). The H200's steps chose the gap a kernel for
every kind.

On the H200 a compiled GPT-2 step (batch 8) ran 1.5 ms longer than its 24.5 ms of kernels
while the host issued it in 23.1 ms: the audit, which compared the host with the kernels alone,
priced the step host-bound and each fix's GPU saving as not reaching the wall clock. With
--write the fits go into the shipped profile as `device_gap` ("seconds" a kernel, and
"step_seconds" where the line won), which auditing/modes.py adds to each step's GPU side.

    python benchmarks/steps/fit_device_gap.py [--gpu h200] [--write] [--profile PATH] \\
        [--skip loops-h100-15] [--out benchmarks/results/steps-h200/device_gap_fit.json]

(--profile: write into that profile instead of the shipped one, e.g. the H100 probe's under
benchmarks/results; --skip: leave a result folder out of the fit, to judge it out of sample.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.bench import write_results  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
PROFILES = ROOT / "src/gpushape/hardware/profiles"
KINDS = ("eager", "compile", "graph", "compile-graphs")
BOUND = 0.8  # issued in under this share of its busy time: the GPU alone set the pace
MIN_STEPS = 3  # a kind timed on fewer steps is not fitted
LINE_MARGIN = 0.9  # the line (two numbers) is kept where it errs by a tenth less than one number


def variant_kind(name: str) -> str | None:
    """How a `gpushape bench` variant runs its step; None where it is mixed or unknown."""
    if "compile-graphs" in name:
        return "compile-graphs"
    if name.endswith("graph") and "compile" not in name:
        return "graph"
    if "compile" in name:
        return None if name.endswith("graph") else "compile"
    if name in ("eager", "channels-last"):
        return "eager"
    return None  # optimize alone may keep graph-layers


def stage_kinds(mode: str, stages: list[str]) -> dict[str, str | None]:
    """How each stage of a fix-by-fix loop runs: the loop's mode until graph-layers (mixed from
    there on), the closing cuda-graphs stage as a whole-step graph (eager) or torch.compile's
    graphs (compile)."""
    out: dict[str, str | None] = {}
    mixed = False
    for stage in stages:
        mixed = mixed or stage == "+ graph-layers"
        if stage == "+ cuda-graphs":
            out[stage] = "compile-graphs" if mode == "compile" else "graph"
        else:
            out[stage] = None if mixed else mode
    return out


def steps_of(path: Path) -> list[dict]:
    """The timed steps of one result file, each with its kind."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    if isinstance(data.get("stages"), dict) and data.get("mode") in ("eager", "compile"):
        kinds = stage_kinds(data["mode"], list(data["stages"]))
        pairs = [(name, kinds[name], s) for name, s in data["stages"].items()]
    elif isinstance(data.get("variants"), dict):
        pairs = [(n, variant_kind(n), s) for n, s in data["variants"].items()]
    else:
        return []
    rows = []
    for name, kind, s in pairs:
        if kind is None or not isinstance(s, dict):
            continue
        wall, busy, issue, kernels = (
            s.get(k) for k in ("median_s", "gpu_busy_s", "issue_s", "kernels")
        )
        if not (wall and busy and issue and kernels):
            continue
        rows.append(
            {
                "file": str(path.relative_to(RESULTS)),
                "model": str(data.get("model") or path.stem),
                "step": name,
                "kind": kind,
                "wall_s": wall,
                "busy_s": busy,
                "issue_s": issue,
                "kernels": kernels,
                "gpu_bound": issue < BOUND * busy,
                "gap_s": (wall - busy) / kernels,
            }
        )
    return rows


def per_kernel(rows: list[dict]) -> tuple[float, float]:
    """(0, the median gap a kernel)."""
    return 0.0, statistics.median(r["gap_s"] for r in rows)


def line(rows: list[dict]) -> tuple[float, float]:
    """(seconds a step, seconds a kernel): idle time against kernels by least squares, neither
    negative (a negative part dropped and the other refitted alone)."""
    k = [r["kernels"] for r in rows]
    y = [r["wall_s"] - r["busy_s"] for r in rows]
    mk, my = statistics.fmean(k), statistics.fmean(y)
    sxx = sum((x - mk) ** 2 for x in k)
    b = sum((x - mk) * (v - my) for x, v in zip(k, y)) / sxx if sxx else 0.0
    a = my - b * mk
    if b <= 0:
        return my, 0.0
    if a < 0:
        return 0.0, sum(x * v for x, v in zip(k, y)) / sum(x * x for x in k)
    return a, b


def held_out_error_s(rows: list[dict], fitter) -> float | None:
    """The median absolute error of each model's idle time a step, fitted on the other models'
    steps; None with fewer than two models."""
    models = sorted({r["model"] for r in rows})
    if len(models) < 2:
        return None
    errors = []
    for m in models:
        a, b = fitter([r for r in rows if r["model"] != m])
        errors += [abs(a + b * r["kernels"] - (r["wall_s"] - r["busy_s"])) for r in rows
                   if r["model"] == m]  # fmt: skip
    return statistics.median(errors)


def fit(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for kind in KINDS:
        used = [r for r in rows if r["kind"] == kind and r["gpu_bound"]]
        if len(used) < MIN_STEPS:
            continue
        gaps = sorted(r["gap_s"] for r in used)
        quartiles = statistics.quantiles(gaps, n=4) if len(gaps) > 1 else [gaps[0]] * 3
        errors = {"per kernel": held_out_error_s(used, per_kernel),
                  "per step and kernel": held_out_error_s(used, line)}  # fmt: skip
        won = errors["per step and kernel"] is not None and (
            errors["per step and kernel"] < LINE_MARGIN * errors["per kernel"]
        )
        step_s, kernel_s = line(used) if won else per_kernel(used)
        out[kind] = {
            "seconds": kernel_s,
            "step_seconds": step_s,
            "form": "per step and kernel" if won else "per kernel",
            "held_out_error_s": errors,
            "steps": len(gaps),
            "models": len({r["model"] for r in used}),
            "p25_s": quartiles[0],
            "p75_s": quartiles[2],
            "source": "benchmarks/steps/fit_device_gap.py",
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h200", help="the results' GPU kind: h200 or h100")
    p.add_argument("--write", action="store_true", help="put the fit into the shipped profile")
    p.add_argument("--profile", type=Path, default=None, help="with --write: this profile instead")
    p.add_argument("--skip", action="append", default=[], help="a result folder to leave out")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    folders = sorted(RESULTS.glob(f"bench-{args.gpu}")) + sorted(
        RESULTS.glob(f"loops-{args.gpu}-*")
    )
    folders = [f for f in folders if f.name not in args.skip]
    rows = [r for folder in folders for f in sorted(folder.glob("*.json")) for r in steps_of(f)]
    fitted = fit(rows)
    print(f"{'kind':15} {'steps':>5} {'us a kernel':>11} {'ms a step':>9} {'p25-p75 us':>12}"
          "  held-out error ms (per kernel / per step and kernel)")  # fmt: skip
    for kind, row in fitted.items():
        spread = f"{row['p25_s'] * 1e6:.2f}-{row['p75_s'] * 1e6:.2f}"
        errors = " / ".join(
            "-" if e is None else f"{e * 1e3:.3f}" for e in row["held_out_error_s"].values()
        )
        print(f"{kind:15} {row['steps']:5d} {row['seconds'] * 1e6:11.2f} "
              f"{row['step_seconds'] * 1e3:9.3f} {spread:>12}  {errors}")  # fmt: skip
    if args.out:
        write_results(args.out, {"fit": fitted, "steps": rows}, gpu_profile=args.gpu)
    if args.write:
        path = args.profile or PROFILES / f"{args.gpu}-sxm.json"
        profile = json.loads(path.read_text())
        profile["device_gap"] = {**profile.get("device_gap", {}), **fitted}
        write_profile(profile, path)
        print(f"wrote device_gap into {path}")


if __name__ == "__main__":
    main()
