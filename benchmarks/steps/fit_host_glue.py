"""Fit the host model's two real-model rates from a GPU run of host_by_op.py, on this machine.

From host_by_op.json (forward and backward issue seconds of real eager steps, unprofiled, and
torch.profiler's nodes): `module_glue`, the Python a module call costs beyond its ops, fitted
as probe/host_glue.py fits it (the meta traces are re-made here, at the rates the GPU run
priced them at); `accumulate_grad`, the backward's node per gradient leaf, as the profiler
timed the AccumulateGrad nodes, scaled by each model's unprofiled / profiled backward, median
over the models (`gpushape probe` measures it directly on a chain). Then every model's forward
and whole step predicted before and after, the glue also fitted leaving that model out; and
host_validate.json's small-batch steps (another lease, another host) before and after. And
gpushape's row norms' own host rates (class gpushape_norm, priced as its BatchNormAct2d until
measured), from host_by_size.json's chains of AddLayerNorm. --write-profile puts the rates into
the shipped H200 profile. Prints a table last.

    python benchmarks/steps/fit_host_glue.py --write-profile \\
        --out benchmarks/results/steps-h200/host_glue_fit.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import gpushape  # noqa: E402
from gpushape.bench import write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.probe.host_glue import fit, predicted_sample  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.tracing.host import host_cost  # noqa: E402

RESULTS = ROOT / "benchmarks/results/steps-h200"
PROFILE = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"


class _Gpu:  # what host_cost reads of a GPUSpec
    def __init__(self, rates: dict[str, float]) -> None:
        self.achievable = type("A", (), {"host": rates})()


def _trace(spec: str, batch: int | None):
    meta = resolve_model(spec, batch=batch, dtype=torch.bfloat16, device="meta")
    return gpushape.trace(meta.model, meta.example_inputs, train=True)


def accumulate_grad_s(rows: list[dict]) -> tuple[float, dict[str, float]]:
    per = {}
    for r in rows:
        node = r["backward_nodes"].get("torch::autograd::AccumulateGrad")
        if node and r["profiled_backward_us"]:
            late = r.get("backward_late_s", r["backward_s"])  # as the profile's process ran
            scale = late / (r["profiled_backward_us"] * 1e-6)
            per[r["model"]] = node[1] / node[0] * 1e-6 * scale
    return statistics.median(per.values()), per


def fused_norm_rates(path: Path) -> dict[str, dict]:
    """gpushape's row norms (class `gpushape_norm`) as host_by_size.py timed AddLayerNorm in a
    chain: forward, and forward+backward less forward, medians over its sizes and BLAS set-ups."""
    data = json.loads(path.read_text())
    chains = [by_rows["norm chain"]["AddLayerNorm"] for blas in data["results"].values()
              for by_rows in blas.values()]  # fmt: skip
    fwd = statistics.median(c["forward"] for c in chains)
    bwd = statistics.median(c["forward+backward"] - c["forward"] for c in chains)
    source = f"{path.relative_to(ROOT)} ({data['environment']['date_utc'][:10]})"
    what = f"gpushape's AddLayerNorm in a chain of 24 sites, median of {len(chains)} runs"
    return {
        "gpushape_norm": {"seconds": fwd, "workload": f"{what}, forward; from {source}",
                          "calls": len(chains)},
        "gpushape_norm/backward": {"seconds": bwd, "calls": len(chains),
                                   "workload": f"{what}, backward; from {source}"},
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--by-op", default=str(RESULTS / "host_by_op.json"))
    p.add_argument("--validate", default=str(RESULTS / "host_validate.json"))
    p.add_argument("--by-size", default=str(RESULTS / "host_by_size.json"))
    p.add_argument("--out", default=str(RESULTS / "host_glue_fit.json"))
    p.add_argument("--write-profile", action="store_true")
    args = p.parse_args()
    by_op = json.loads(Path(args.by_op).read_text())
    rows = [r for r in by_op["results"]["rows"] if "error" not in r]
    old = {k: v for k, v in by_op["results"]["host_rates"].items() if k not in ("module_glue",)}
    old.pop("accumulate_grad", None)
    samples = {r["model"]: predicted_sample(r["model"], r["forward_s"], old, r["batch"])
               for r in rows}  # fmt: skip
    glue = fit(list(samples.values()))
    acc, acc_per = accumulate_grad_s(rows)
    new = {**old, "module_glue": glue["seconds"], "accumulate_grad": acc}
    table = []
    for r in rows:
        name, s = r["model"], samples[r["model"]]
        loo = fit([v for k, v in samples.items() if k != name])["seconds"]
        trace = _trace(name, r["batch"])
        step = r["forward_s"] + r["backward_s"]
        table.append({
            "model": name, "host": "host_by_op", "batch": r["batch"],
            "forward_ms": r["forward_s"] * 1e3, "step_ms": step * 1e3,
            "forward_before": (s.ops_s + s.modules * old["module"]) / r["forward_s"],
            "forward_after": (s.ops_s + s.modules * glue["seconds"]) / r["forward_s"],
            "forward_left_out": (s.ops_s + s.modules * loo) / r["forward_s"],
            "step_before": host_cost(trace, _Gpu(old)).seconds / step,
            "step_after": host_cost(trace, _Gpu(new)).seconds / step,
        })  # fmt: skip
    validate = json.loads(Path(args.validate).read_text())
    for r in validate["results"]["rows"]:
        if "error" in r or r["batch"][0][0] != 2:
            continue
        trace = _trace(r["model"], 2)
        table.append({
            "model": r["model"], "host": "host_validate", "batch": 2,
            "step_ms": r["measured_issue_s"] * 1e3,
            "step_before": host_cost(trace, _Gpu(old)).seconds / r["measured_issue_s"],
            "step_after": host_cost(trace, _Gpu(new)).seconds / r["measured_issue_s"],
        })  # fmt: skip
    sources = f"{Path(args.by_op).relative_to(ROOT)} ({by_op['environment']['date_utc'][:10]})"
    rates = {
        "module_glue": {**glue, "workload": glue["workload"] + f", from {sources}"},
        "accumulate_grad": {
            "seconds": acc,
            "workload": "AccumulateGrad nodes as torch.profiler timed them, scaled by the "
            f"unprofiled backward, median over {', '.join(acc_per)}, from {sources}",
            "calls": len(acc_per),
            "per_model": acc_per,
        },
    }
    rates.update(fused_norm_rates(Path(args.by_size)))
    write_results(args.out, {"rates": rates, "rows": table})
    if args.write_profile:
        profile = json.loads(PROFILE.read_text())
        # gpushape's row norms measured on their own chain (calibrate_memory_efficiency.py
        # --parts host, or the probe: the host of this fit) are kept over host_by_size's;
        # accumulate_grad is the fit's: the probe's chain times a stack's backward node too
        chain = {k for k, v in profile["host"].items() if "from " not in v.get("workload", "")}
        keep = chain & {"gpushape_norm", "gpushape_norm/backward"}
        profile["host"].update({k: v for k, v in rates.items() if k not in keep})
        write_profile(profile, PROFILE)
    print(
        f"module_glue {glue['seconds'] * 1e6:.1f} us a module call "
        f"(per model {', '.join(f'{k} {v * 1e6:.1f}' for k, v in glue['per_model'].items())})"
    )
    norm = rates["gpushape_norm"]["seconds"], rates["gpushape_norm/backward"]["seconds"]
    print(f"gpushape_norm {norm[0] * 1e6:.1f} us forward, {norm[1] * 1e6:.1f} us backward")
    print(
        f"accumulate_grad {acc * 1e6:.2f} us a leaf "
        f"(per model {', '.join(f'{k} {v * 1e6:.2f}' for k, v in acc_per.items())})"
    )
    print("predicted / measured host seconds")
    print(f"{'model':<28} {'host':<14} {'fwd before':>10} {'after':>6} {'left out':>8} "
          f"{'step ms':>8} {'step before':>11} {'after':>6}")  # fmt: skip
    for t in table:
        fwd = (
            f"{t['forward_before']:>10.2f} {t['forward_after']:>6.2f} {t['forward_left_out']:>8.2f}"
            if "forward_before" in t
            else " " * 26
        )
        print(f"{t['model'][:28]:<28} {t['host']:<14} {fwd} {t['step_ms']:>8.2f} "
              f"{t['step_before']:>11.2f} {t['step_after']:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
