"""Re-predict the fix-by-fix loops timed on the GPU with the cost model as it is now, on this
machine: the measured step times stay those of the GPU run, only the predictions are re-made.

For each loop file (bench-h200/loop-<model>-<mode>.json, written by `gpushape bench MODEL
--optimize --mode M`), the model is rebuilt on the meta device at the batch it ran, each stage
rebuilt with the same transforms (optimize, transforms named, no numeric check on meta), and
the loop's own prediction (`steps/fix_by_fix.py`: each stage's audit in the mode, the fixes the
trace cannot see from their findings) made again. graph-layers, which captures on a GPU, is
not rebuilt: its stage is the stage before, priced in graph mode as the loop prices it. The
optimizer's fix is priced from its finding, as in the loop. Prints old and new prediction
beside the measured saving; writes them to <folder>/loop-lib-recheck.json.

    python benchmarks/steps/recheck_loops.py [--folder loops-h200-2] [--profile PROFILE.json] \
        [--loops loop-resnet50-eager-0650.json ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.auditing.api import audit  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.steps.batch import synthetic_batch  # noqa: E402
from gpushape.steps.host_here import host_scale, scaled_target  # noqa: E402
from gpushape.steps.loop_plan import GRAPH_LAYERS  # noqa: E402
from gpushape.steps.loop_predict import GIVEN, predictions  # noqa: E402
from gpushape.steps.loop_predict import expected_steps as _expected  # noqa: E402
from gpushape.steps.loop_predict import model_dtype as _dtype  # noqa: E402
from gpushape.steps.step import build_step, make_optimizer  # noqa: E402
from gpushape.steps.variants import Spec  # noqa: E402
from gpushape.transforms import optimize  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
FOLDER = "bench-h200"
GPU = "h200-sxm"


def _args(command: str) -> dict:
    words = shlex.split(command)
    out = {"model": words[words.index("bench") + 1], "batch": None, "optimizer": "auto"}
    flags = (("--batch", "batch"), ("--optimizer", "optimizer"), ("--mode", "mode"))
    for flag, key in (*flags, ("--input", "input")):
        if flag in words:
            out[key] = words[words.index(flag) + 1]
    out["batch"] = int(out["batch"]) if out["batch"] else None
    out["inputs"] = [out.pop("input")] if "input" in out else None
    return out


def _stage(model, batch, transforms: tuple[str, ...], mode: str, optimizer: str, gpu=GPU):
    """The stage's model on meta with `transforms` applied (graph-layers left out), its step's
    optimizer fused where fused-optimizer is among them."""
    import copy

    model = copy.deepcopy(model)
    wanted = [t for t in transforms if t not in (GRAPH_LAYERS, "fused-optimizer")]
    if wanted:
        model, _ = optimize(model, batch.inputs, gpu=gpu, dtype=_dtype(model), mode=mode,
                            transforms=wanted)  # fmt: skip
    step = build_step(model, batch, optimizer)
    if "fused-optimizer" in transforms:  # the stage steps the fused optimizer, as the run's did
        step.optimizer = _fused(step.optimizer)
    return SimpleNamespace(step=step)


def _fused(optimizer):
    """`optimizer` built again with fused=True on its (meta) parameters, which
    transforms/fused_optimizer.py refuses: the audit only reads which implementation steps."""
    import inspect

    names = inspect.signature(type(optimizer)).parameters
    options = {k: v for k, v in optimizer.defaults.items() if k in names}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return type(optimizer)(params, **{**options, "fused": True, "foreach": None})


def _as_the_run_had_it(data: dict):
    """The GPU run's transformers (5.17) built an all-true mask while compiling, which later
    releases do not: a loop that applied skip-attention-mask is re-predicted with that release's
    behaviour emulated (tests/_hf_masks.py), else the finding it fixed would not fire here."""
    import contextlib

    if "+ skip-attention-mask" not in data["stages"]:
        return contextlib.nullcontext()
    sys.path.insert(0, str(ROOT / "tests"))
    from _hf_masks import old_masks

    return old_masks()


def recheck(path: Path, gpu=GPU) -> dict:
    data = json.loads(path.read_text())
    with _as_the_run_had_it(data):
        return _recheck(path, data, gpu)


def _recheck(path: Path, data: dict, gpu) -> dict:
    args = _args(data["environment"]["command"])
    mode = data["mode"]
    r = resolve_model(args["model"], batch=args["batch"], inputs=args["inputs"])
    batch = synthetic_batch(r.model, r.example_inputs)
    report = audit(r.model, r.example_inputs, gpu, dtype=_dtype(r.model), train=True,
                   optimizer=make_optimizer(r.model, batch, args["optimizer"]),
                   mode=mode)  # fmt: skip
    predicted = predictions(report)
    names = list(data["stages"])
    captured = [
        SimpleNamespace(transform=c["transform"], module=c["module"])
        for c in (data.get("optimize") or {}).get("applied", [])
        if c["transform"] == GRAPH_LAYERS
    ]
    runner = "compile" if mode == "compile" else "eager"
    specs, built, applied = {GIVEN: Spec(runner=runner)}, {}, []
    built[GIVEN] = _stage(r.model, batch, (), mode, args["optimizer"], gpu)
    for name in names[1:]:
        fix = name.removeprefix("+ ")
        graphed = fix == "cuda-graphs"  # a runner, not a transform: the loop's last stage
        if not graphed:
            applied.append(fix)
        stage_runner = ("graph" if mode == "eager" else "compile-graphs") if graphed else runner
        specs[name] = Spec(optimize_mode=mode, transforms=tuple(applied), runner=stage_runner,
                           fused_optimizer="fused-optimizer" in applied)  # fmt: skip
        built[name] = _stage(r.model, batch, tuple(applied), mode, args["optimizer"], gpu)
        if GRAPH_LAYERS in applied:  # the layers the run captured, for their replays' host
            built[name].optimize_report = SimpleNamespace(applied=captured)
    expected = _expected(specs, built, report, predicted, gpu, mode)
    # the loop's second prediction: the host's rates scaled to the run's own host, from its
    # issue time of the step as given (steps/host_here.py)
    stage = data["stages"][GIVEN]
    given = SimpleNamespace(
        issue_s=stage.get("issue_s"),
        gpu_busy_s=stage.get("gpu_busy_s"),
        median_s=stage["median_s"],
        step_times_s=stage["step_times_s"],
    )
    scale = host_scale(given, report.step.host_s if report.step else None)
    here = None
    if scale is not None:
        target = scaled_target(gpu, scale)
        report_here = audit(r.model, r.example_inputs, target, dtype=_dtype(r.model),
                            train=True, optimizer=make_optimizer(r.model, batch,
                            args["optimizer"]), mode=mode)  # fmt: skip
        here = _expected(specs, built, report_here, predictions(report_here), target, mode)
    rows = []
    for before, stage, old in zip(names, names[1:], data["fixes"]):
        a, b = data["stages"][before], data["stages"][stage]
        new_wall = expected[before][1] - expected[stage][1]
        new_gpu = expected[before][0] - expected[stage][0]
        measured = a["median_s"] - b["median_s"]
        here_wall = None if here is None else here[before][1] - here[stage][1]
        rows.append({
            "model": data["model"], "mode": mode, "fix": old["fix"],
            "predicted_wall_s_then": old["predicted_wall_s"], "predicted_wall_s": new_wall,
            "predicted_gpu_s": new_gpu, "measured_wall_s": measured,
            "measured_gpu_s": old["measured_gpu_s"],
            "ratio": new_wall / measured if measured > 0 else None,
            "step_predicted_s": expected[GIVEN][1],
            "predicted_here_wall_s": here_wall, "host_scale": scale,
            "ratio_here": here_wall / measured if here_wall is not None and measured > 0 else None,
        })  # fmt: skip
    return {"file": f"{path.parent.name}/{path.name}", "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--folder", default=FOLDER, help="under benchmarks/results: the loop runs")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="price on the chip this profile was measured on, calibrated by it (default: the "
        "H200 with its shipped profile); for loops on another GPU, the profile its run used",
    )
    p.add_argument(
        "--loops",
        nargs="+",
        default=None,
        help="loop JSONs in the folder to re-predict (default: the runs loop-lib.csv lists)",
    )
    args = p.parse_args()
    gpu = GPU
    if args.profile is not None:
        from gpushape.hardware import get_gpu
        from gpushape.hardware.profile import apply_profile, read_profile

        profile = read_profile(args.profile)
        gpu = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(args.profile))
    folder = RESULTS / args.folder
    if args.loops:
        files = [folder / name for name in args.loops]
    else:
        with open(folder / "loop-lib.csv", newline="") as f:
            keys = list(dict.fromkeys((r["model"], r["mode"]) for r in csv.DictReader(f)))
        stem = lambda m: "".join("_" if c in ":/?&=" else c for c in m)
        files = [folder / f"loop-{stem(m)}-{mode}.json" for m, mode in keys]
    checked = [recheck(path, gpu) for path in files]
    where = gpu if isinstance(gpu, str) else f"{gpu.name} ({args.profile})"
    write_results(folder / "loop-lib-recheck.json", checked, gpu_profile=where)
    lines = [
        f"{'model':36} {'mode':8} {'fix':22} {'then':>8} {'now':>8} {'measured':>9} {'now/meas':>9}"
        f" {'here':>8} {'here/meas':>9} {'host x':>7}"
    ]
    for c in checked:
        for r in c["rows"]:
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
            here = (
                "-"
                if r["predicted_here_wall_s"] is None
                else f"{r['predicted_here_wall_s'] * 1e3:.3f}"
            )
            ratio_here = "-" if r["ratio_here"] is None else f"{r['ratio_here']:.2f}"
            scale = "-" if r["host_scale"] is None else f"{r['host_scale']:.2f}"
            lines.append(
                f"{r['model'][:36]:36} {r['mode']:8} {r['fix']:22} "
                f"{r['predicted_wall_s_then'] * 1e3:8.3f} {r['predicted_wall_s'] * 1e3:8.3f} "
                f"{r['measured_wall_s'] * 1e3:9.3f} {ratio:>9} {here:>8} {ratio_here:>9} "
                f"{scale:>7}"
            )
    # the table beside the JSON it comes from, written with it (a log kept by hand went stale)
    (folder / "loop-lib-recheck.log").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
