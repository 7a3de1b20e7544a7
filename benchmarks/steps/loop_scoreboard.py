"""Every fix-by-fix loop one GPU kind has timed, re-predicted with the cost model as it is now,
and judged against the advice's target, on this machine (no GPU).

Each `loops-<gpu>-*` folder (and `bench-<gpu>`) holds loops that `gpushape bench MODEL
--optimize --mode M` ran: each fix applied on top of the ones before and timed against them,
alternating. `recheck_loops.py` re-predicts one folder's loops and writes beside them; this
script re-predicts all of them at once into one file, so the cost model's standing over every
measurement it has is one table, not forty. The measured savings stay those of the GPU runs.

A fix is judged as the results page judges it (benchmarks/summary/loops_lib.py): where its
predicted wall saving is at least 1% of the predicted step (a high or medium finding), it
meets the target when predicted / measured lies within 0.5-2x and the measured saving is
positive; "within noise" where the run's rounds did not agree on the saving's sign. graph-layers
(kept by optimize on a timing, not from a finding) is shown but not judged. Each fix is judged
twice: on the profile's host rates, and on them scaled to the run's own host (`here`,
steps/host_here.py), since the lent hosts issue kernels 0.8-1.5x as fast as the profiled one.

    python benchmarks/steps/loop_scoreboard.py --gpu h100 \\
        --profile benchmarks/results/probe-h100/h100-sxm.json \\
        --out benchmarks/results/audit-cpu/loop-scoreboard-h100.json [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "benchmarks"))

from summary.loops_lib import NOT_FROM_FINDINGS, judged  # noqa: E402

from gpushape.bench import write_results  # noqa: E402

RESULTS = ROOT / "benchmarks/results"


def loop_files(gpu: str) -> list[Path]:
    """Every loop JSON (a dict of stages, its fixes and its mode) of this GPU kind's folders."""
    folders = sorted(RESULTS.glob(f"bench-{gpu}")) + sorted(
        RESULTS.glob(f"loops-{gpu}-*"), key=lambda p: int(p.name.rsplit("-", 1)[-1])
    )
    out = []
    for folder in folders:
        for path in sorted(folder.glob("loop-*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(data.get("stages"), dict) and data.get("fixes") and data.get("mode"):
                out.append(path)
    return out


def verdict(predicted: float | None, measured: float, step: float, noisy: bool, fix: str) -> str:
    """How a fix stands against the target, judged as the results page judges it
    (`summary.loops_lib.judged`): "not judged", "low", "within noise", "meets", "misses"."""
    if fix in NOT_FROM_FINDINGS:
        return "not judged"
    if predicted is None:
        return "low"
    row = {"fix": fix, "predicted_wall_ms": predicted * 1e3, "measured_wall_ms": measured * 1e3}
    judgement = judged(row, step * 1e3)
    if judgement == "-":
        return "low"
    if noisy:
        return "within noise"
    return "meets" if judgement == "meets" else "misses"


def _one(job: tuple[str, str | None]) -> dict:
    """Re-predict one loop file (in a worker process: the audit is single-threaded)."""
    path, profile = job
    from recheck_loops import GPU, recheck

    gpu = GPU
    if profile:
        from gpushape.hardware import get_gpu
        from gpushape.hardware.profile import apply_profile, read_profile

        data = read_profile(Path(profile))
        gpu = apply_profile(get_gpu(data["gpu"]), data, origin=profile)
    try:
        checked = recheck(Path(path), gpu)
    except Exception as e:  # an old loop this code cannot rebuild: said, not fatal
        return {"file": str(Path(path).relative_to(RESULTS)), "error": f"{type(e).__name__}: {e}"}
    run = json.loads(Path(path).read_text())
    noisy = {f["fix"]: bool(f.get("within_noise")) for f in run["fixes"]}
    for row in checked["rows"]:
        row["within_noise"] = noisy.get(row["fix"], False)
        step = row["step_predicted_s"]
        row["verdict"] = verdict(
            row["predicted_wall_s"], row["measured_wall_s"], step, row["within_noise"], row["fix"]
        )
        row["verdict_here"] = verdict(
            row["predicted_here_wall_s"], row["measured_wall_s"], step, row["within_noise"],
            row["fix"],
        )  # fmt: skip
    return checked


def summary(checked: list[dict]) -> dict:
    """Counts of verdicts, overall and by fix, and the judged fixes' median |log ratio|."""
    rows = [r for c in checked for r in c.get("rows", [])]
    out: dict = {}
    for key in ("verdict", "verdict_here"):
        out[key] = dict(Counter(r[key] for r in rows))
        by_fix: dict[str, Counter] = {}
        for r in rows:
            by_fix.setdefault(r["fix"], Counter())[r[key]] += 1
        out[key + "_by_fix"] = {fix: dict(c) for fix, c in sorted(by_fix.items())}
    judged = [r for r in rows if r["verdict"] in ("meets", "misses") and r["ratio"]]
    if judged:
        import math

        out["median_abs_log2_ratio"] = statistics.median(abs(math.log2(r["ratio"])) for r in judged)
    out["errors"] = [c for c in checked if "error" in c]
    return out


def table(checked: list[dict]) -> list[str]:
    lines = [
        f"{'file':58} {'fix':22} {'pred':>8} {'meas':>8} {'p/m':>5} {'verdict':>12} "
        f"{'here':>8} {'h/m':>5} {'here verdict':>12}"
    ]
    for c in checked:
        if "error" in c:
            lines.append(f"{c['file'][:58]:58} could not be re-predicted: {c['error'][:80]}")
            continue
        for r in c["rows"]:
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
            here = r["predicted_here_wall_s"]
            hr = "-" if r["ratio_here"] is None else f"{r['ratio_here']:.2f}"
            here_ms = "-" if here is None else f"{here * 1e3:.3f}"
            lines.append(
                f"{c['file'][:58]:58} {r['fix'][:22]:22} {r['predicted_wall_s'] * 1e3:8.3f} "
                f"{r['measured_wall_s'] * 1e3:8.3f} {ratio:>5} {r['verdict']:>12} "
                f"{here_ms:>8} {hr:>5} {r['verdict_here']:>12}"
            )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h200", help="the results' GPU kind: h200 or h100")
    p.add_argument(
        "--profile", default=None, help="the profile the runs used (default: the shipped H200's)"
    )
    p.add_argument("--out", type=Path, required=True, help="the JSON to write (a .log beside)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = p.parse_args()
    files = loop_files(args.gpu)
    if not files:
        sys.exit(f"no loops under {RESULTS} for GPU kind {args.gpu!r}")
    jobs = [(str(f), args.profile) for f in files]
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        checked = []
        for i, result in enumerate(pool.map(_one, jobs), 1):
            checked.append(result)
            print(f"[{i}/{len(jobs)}] {result['file']}", file=sys.stderr, flush=True)
    summ = summary(checked)
    where = args.profile or f"{args.gpu} shipped profile"
    write_results(args.out, {"summary": summ, "loops": checked}, gpu_profile=where)
    lines = table(checked)
    lines += ["", f"verdicts (profile's host): {json.dumps(summ['verdict'])}"]
    lines += [f"verdicts (this run's host): {json.dumps(summ['verdict_here'])}"]
    if "median_abs_log2_ratio" in summ:
        lines += [f"judged fixes' median |log2(pred/meas)|: {summ['median_abs_log2_ratio']:.2f}"]
    args.out.with_suffix(".log").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-3:]))


if __name__ == "__main__":
    main()
