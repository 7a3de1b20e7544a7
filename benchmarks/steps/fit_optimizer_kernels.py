"""Fit what an optimizer step's multi-tensor kernels cost on one GPU kind, from the kernels of
the fix-by-fix loops timed there (`gpushape bench --optimize`: the stage before
fused-optimizer steps with foreach, that stage with the fused implementation).

The cost model priced an optimizer step at its bytes at the copy rate. That held for GPT-2's
and a LLaMA-style decoder's AdamW (75-148 large tensors) and missed convnets' SGD by 2-5x: on an
H100 EfficientNet-B0's foreach step (213 tensors, 28 us of bytes) ran 124 us of kernels. A
multi-tensor kernel gives every tensor blocks of its own and splits a long list into several
launches, so each tensor costs time beyond its bytes. Each step's `multi_tensor_apply` kernels
(the loop JSON's `top_kernels`, summed) are fitted, per implementation, as

    time = bytes / (copy rate x efficiency[class]) + tensor_seconds x tensors x kernels

(`gpushape.probe.workloads.optimizer.fit`, which `gpushape probe` uses on its own timed steps:
least squares on relative error; bytes, tensors and kernels as tracing/optimizer_step.py counts
them on a meta copy of the model's parameters; the efficiency by optimizer class where a class
was timed, fused AdamW's and fused SGD's kernels differing). An implementation timed on fewer
than three models takes `tensor_seconds` from the other implementation's fit on the same GPU.
A stage whose kernel list may miss some of its optimizer kernels (the 12 longest kept, a foreach
AdamW without both of its kernel kinds) is left out.

    python benchmarks/steps/fit_optimizer_kernels.py [--gpu h100] [--write] [--profile PATH] \\
        [--out benchmarks/results/probe-h100/optimizer_kernels_fit.json]

With --write the rows go into the profile's "optimizer_kernels" (default: the shipped one for
--gpu; for the H100, benchmarks/results/probe-h100/h100-sxm.json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.bench import write_results  # noqa: E402
from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.probe.workloads.optimizer import fit, predicted_s  # noqa: E402
from gpushape.tracing.optimizer_step import current_step, fused_step  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
PROFILES = {
    "h200": ROOT / "src/gpushape/hardware/profiles/h200-sxm.json",
    "h100": RESULTS / "probe-h100/h100-sxm.json",
}
FUSED_STAGE = "+ fused-optimizer"
MULTI = "multi_tensor_apply_kernel"
KINDS = {  # how each implementation's kernel names start (kept names are cut at ~120 chars)
    ("foreach", "AdamW"): ("TensorListMetadata<", "TensorListScalarLis"),
    ("foreach", "SGD"): ("TensorListMetadata<",),
    ("fused", "AdamW"): ("FusedOptimizer",),
    ("fused", "SGD"): ("TensorListMetadata<",),
}
FULL_LIST = 40  # a stage listing this many kernels lists every optimizer kernel


def _option(command: str, name: str) -> list[str]:
    return re.findall(rf"{name}[ =](\S+)", command)


def step_counts(model: str, command: str) -> dict[str, dict]:
    """{"foreach"|"fused": {bytes, tensors, kernels}} and the optimizer's class for the
    loop's model and optimizer, counted on a meta copy."""
    inputs = [s.strip("'\"") for s in _option(command, "--input")] or None
    resolved = resolve_model(model, batch=None if inputs else 2, inputs=inputs)
    params = [p for p in resolved.model.parameters() if p.requires_grad]
    kind = (_option(command, "--optimizer") or ["auto"])[0]
    x = resolved.example_inputs[0] if resolved.example_inputs else None
    image = isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 4
    if kind == "sgd" or (kind == "auto" and image):
        opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4)
    counted = {"foreach": current_step(opt), "fused": fused_step(opt)}
    return {
        "class": type(opt).__name__,
        **{
            impl: {"bytes": c.bytes_moved, "tensors": c.parameters, "kernels": c.kernels}
            for impl, c in counted.items()
        },
    }


def optimizer_kernels_s(stage: dict, impl: str, cls: str) -> float | None:
    """The stage's multi-tensor kernel time, or None where its list may miss some."""
    listed = [(name, s) for name, s in stage.get("top_kernels", []) if MULTI in name]
    need = KINDS.get((impl, cls), ("TensorListMetadata<",))
    complete = len(stage.get("top_kernels", [])) >= FULL_LIST or all(
        any(f"::{kind}" in name for name, _ in listed) for kind in need
    )
    return sum(s for _, s in listed) if listed and complete else None


def timed_steps(gpu: str) -> list[dict]:
    """One row per (loop, implementation) with its kernels' time and what the model counts."""
    counts: dict[tuple[str, str], dict] = {}
    rows = []
    for path in sorted(RESULTS.glob(f"*-{gpu}*/loop-*.json")):
        if path.name.endswith("recheck.json"):
            continue
        data = json.loads(path.read_text())
        stages, env = data.get("stages", {}), data.get("environment", {})
        if FUSED_STAGE not in stages or gpu.upper() not in str(env.get("gpu")):
            continue
        names = list(stages)
        before = stages[names[names.index(FUSED_STAGE) - 1]]
        key = (data["model"], env.get("command", ""))
        if key not in counts:
            counts[key] = step_counts(*key)
        c = counts[key]
        for impl, stage in (("foreach", before), ("fused", stages[FUSED_STAGE])):
            measured = optimizer_kernels_s(stage, impl, c["class"])
            if measured is not None:
                rows.append({"file": f"{path.parent.name}/{path.name}", "model": data["model"],
                             "class": c["class"], "impl": impl, "measured_s": measured,
                             **c[impl]})  # fmt: skip
    return rows


def by_model(rows: list[dict]) -> list[dict]:
    """The median measured time of each (model, implementation)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["impl"])].append(r)
    return [{**g[0], "measured_s": statistics.median(r["measured_s"] for r in g), "runs": len(g)}
            for g in groups.values()]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h200", choices=sorted(PROFILES))
    p.add_argument("--write", action="store_true", help="put the fit into the profile")
    p.add_argument("--profile", type=Path, default=None, help="this profile instead")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    path = args.profile or PROFILES[args.gpu]
    profile = read_profile(path)
    bandwidth = apply_profile(get_gpu(profile["gpu"]), profile).attainable_bandwidth_bytes_per_s()
    rows = timed_steps(args.gpu)
    models = by_model(rows)
    fitted = fit(models, bandwidth)
    for row in fitted.values():
        row["source"] = "benchmarks/steps/fit_optimizer_kernels.py"
    print(f"{'implementation':16} {'efficiency':>10} {'us a tensor a kernel':>21}  models")
    for name, row in fitted.items():
        per = f"{row['tensor_seconds'] * 1e6:.3f}" if "tensor_seconds" in row else ""
        print(f"{name:16} {row['efficiency']:10.3f} {per:>21}  {len(row['models'])}")
    print(f"\n{'model':40} {'impl':8} {'runs':>4} {'measured us':>11} {'fit us':>8} {'ratio':>6}")
    for r in sorted(models, key=lambda r: (r["impl"], r["model"])):
        fit_s = predicted_s(r, fitted, bandwidth)
        print(f"{r['model'][:40]:40} {r['impl']:8} {r['runs']:4d} {r['measured_s'] * 1e6:11.1f} "
              f"{fit_s * 1e6:8.1f} {fit_s / r['measured_s']:6.2f}")  # fmt: skip
    if args.out:
        write_results(args.out, {"fit": fitted, "steps": rows}, gpu_profile=args.gpu)
    if args.write:
        profile["optimizer_kernels"] = {**profile.get("optimizer_kernels", {}), **fitted}
        write_profile(profile, path)
        print(f"wrote optimizer_kernels into {path}")


if __name__ == "__main__":
    main()
