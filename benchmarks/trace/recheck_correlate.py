"""Re-predict a committed correlate run with the current cost model: no GPU, the measured side
as it was.

    python benchmarks/trace/recheck_correlate.py [RESULTS.json] [--models timm:convnext_tiny]
        [--profile PROFILE.json] [--assume gemm=0.6,elementwise_strided=0.4] [--out out.json]

Each model of RESULTS.json (default: results/correlate-h200/correlate-lib.json, written by
correlate.py on the GPU) is built on the meta device as correlate.py built it (name, batch,
options, channels_last), traced for a training step and costed with gpushape.cost(math="bf16")
on the run's GPU calibrated by the shipped profile (or --profile). Per module, the predicted
kernel time is set against the committed measured time (torch.profiler device time per module);
Spearman over the committed rows (those with predicted time > 0 now), and the predicted total
over the committed measured total. --assume sets memory-family efficiencies the profile lacks or
holds otherwise (a what-if: families the GPU has yet to measure), and the output says so.
Prints one line per model, before (as committed) and now; Issue #15's line: Spearman >= 0.9 and
predicted / measured within 0.8-1.25.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # this working tree's gpushape
sys.path.insert(0, str(HERE))
from _attribution import spearman  # noqa: E402
from correlate import build  # noqa: E402

import gpushape  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.hardware import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, calibrated, read_profile  # noqa: E402

DEFAULT = HERE.parent / "results" / "correlate-h200" / "correlate-lib.json"
SPEARMAN_LINE, RATIO_LINE = 0.9, (0.8, 1.25)


def gpu_for(results: dict, profile: Path | None, assume: dict[str, float]):
    """The GPUSpec the run's predictions take: the shipped profile's (or `profile`'s), with
    `assume`'s memory-family efficiencies over it."""
    base = get_gpu(results["gpu_spec"])
    if profile is None:
        spec = calibrated(base)
    else:
        spec = apply_profile(base, read_profile(profile), origin=str(profile))
    if assume:
        measured = {**spec.achievable.memory_efficiency, **assume}
        spec = spec.replace(
            achievable=dataclasses.replace(spec.achievable, memory_efficiency=measured)
        )
    return spec


def repredict(result: dict, gpu) -> dict:
    """Module -> predicted kernel seconds for one committed model, and the total."""
    model, inputs = build(
        result["model"],
        result["batch"],
        result.get("options") or {},
        "meta",
        torch.bfloat16,
        bool(result.get("channels_last")),
    )
    trace = gpushape.trace(model, inputs, train=True, name=result["model"])
    report = gpushape.cost(trace, gpu, math="bf16")
    per_module = {path: m.total.kernel_time_s for path, m in report.by_module().items()}
    return {"per_module_s": per_module, "total_s": report.totals.kernel_time_s}


def compare(result: dict, now: dict) -> dict:
    """Spearman and predicted / measured, as committed and now, over the committed rows."""
    rows = [
        (r["module"], now["per_module_s"].get(r["module"], 0.0), r["measured_s"])
        for r in result["rows"]
    ]
    kept = [r for r in rows if r[1] > 0]
    measured_total = result["measured_total_s"]
    return {
        "model": result["model"],
        "modules": len(kept),
        "spearman_before": result["spearman_kernel_time"],
        "spearman_now": spearman([r[1] for r in kept], [r[2] for r in kept]),
        "ratio_before": result["ratio_kernel"],
        "ratio_now": now["total_s"] / measured_total,
        "predicted_total_s_before": result["predicted_total_kernel_s"],
        "predicted_total_s_now": now["total_s"],
        "measured_total_s": measured_total,
        "rows": [{"module": m, "predicted_kernel_s": p, "measured_s": s} for m, p, s in rows],
    }


def meets(spearman_rho: float, ratio: float) -> bool:
    return spearman_rho >= SPEARMAN_LINE and RATIO_LINE[0] <= ratio <= RATIO_LINE[1]


def _assumed(text: str | None) -> dict[str, float]:
    pairs = [p.split("=") for p in text.split(",")] if text else []
    return {k.strip(): float(v) for k, v in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--models", default=None, help="comma-separated; default: all in the file")
    parser.add_argument("--profile", type=Path, default=None, help="default: the shipped one")
    parser.add_argument("--assume", default=None, help="family=efficiency,... (a what-if)")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison as JSON")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    assume = _assumed(args.assume)
    gpu = gpu_for(results, args.profile, assume)
    wanted = set(args.models.split(",")) if args.models else None
    rows = []
    for result in results["results"]:
        if wanted and result["model"] not in wanted:
            continue
        try:
            now = repredict(result, gpu)
        except ImportError as exc:  # timm or transformers absent here
            print(f"{result['model'][:34]:<34} skipped: {exc}")
            continue
        rows.append(compare(result, now))
    print(
        f"{'model':<34}{'modules':>8}{'Spearman before -> now':>24}{'pred/meas before -> now':>25}"
    )
    for r in rows:
        ok = "meets" if meets(r["spearman_now"], r["ratio_now"]) else "misses"
        print(
            f"{r['model'][:34]:<34}{r['modules']:>8}{r['spearman_before']:>12.3f} -> "
            f"{r['spearman_now']:.3f}{r['ratio_before']:>15.3f} -> {r['ratio_now']:.3f}  {ok}"
        )
    if assume:
        print(f"assumed (not measured): {assume}")
    if args.out:
        source = args.results.resolve()
        if source.is_relative_to(HERE.parents[1]):
            source = source.relative_to(HERE.parents[1])
        write_results(
            args.out,
            rows,
            source=str(source),
            gpu=gpu.name,
            assumed=assume,
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
