"""Does the host model (tracing/host.py) predict the host's side of real eager steps?

For each MODEL, at a small batch (the GPU's work is then short, so the host sets the pace): the
seconds Python takes to issue one training step's forward, loss and backward (synchronised
before, not after: the GPU runs behind), median of --repeats, against `host_cost` of the meta
trace with the profile's measured host rates. At the model's default batch: the step's wall
time (synchronised) and GPU busy time (torch.profiler) against the audit's predicted eager
step (GPU side, host side, wall = the longer). Writes --out JSON; prints a table last.

    python benchmarks/steps/host_validate.py --models hf:bert,hf:gpt2 --out $OUT/host_validate.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import gpushape
from gpushape.auditing import audit
from gpushape.bench import write_results
from gpushape.hardware.profile import calibrated
from gpushape.models import resolve_model
from gpushape.steps import synthetic_batch
from gpushape.steps.measure import kernel_profile
from gpushape.tracing.host import host_cost

MODELS = "hf:bert,hf:gpt2,timm:vit_base_patch16_224,timm:resnet50,timm:convnext_tiny"


def _step(model, batch):
    def run() -> None:
        for p in model.parameters():
            p.grad = None
        batch.loss(model(*batch.inputs, **batch.kwargs)).backward()

    return run


def host_seconds(run, repeats: int) -> tuple[float, float]:
    """(median seconds to issue a step, median wall seconds of a step)."""
    for _ in range(3):
        run()
    issue, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        issue.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(issue), statistics.median(wall)


def one(spec: str, batch: int | None, gpu, repeats: int) -> dict:
    real = resolve_model(spec, batch=batch, dtype=torch.bfloat16, device="cuda")
    meta = resolve_model(spec, batch=batch, dtype=torch.bfloat16, device="meta")
    trace = gpushape.trace(meta.model, meta.example_inputs, train=True)
    predicted = host_cost(trace, gpu)
    report = audit(meta.model, meta.example_inputs, gpu, dtype=torch.bfloat16, train=True)
    run = _step(real.model, synthetic_batch(real.model, real.example_inputs))
    issue, wall = host_seconds(run, repeats)
    _, busy, _ = kernel_profile(run, cuda=True)
    out = {
        "model": spec,
        "batch": [list(t.shape) for t in real.example_inputs if isinstance(t, torch.Tensor)],
        "measured_issue_s": issue,
        "measured_wall_s": wall,
        "measured_gpu_busy_s": busy,
        "predicted_host_s": predicted.seconds if predicted else None,
        "predicted_counts": predicted.to_dict() if predicted else None,
        "predicted_gpu_s": report.step.gpu_s if report.step else None,
        "predicted_wall_s": report.step.wall_s if report.step else None,
    }
    del real, run
    torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=MODELS)
    p.add_argument("--small", type=int, default=2, help="the small batch (host-bound)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default="host_validate.json")
    args = p.parse_args()
    gpu = calibrated("h200")  # the bundled profile's measured rates
    rows = []
    for spec in args.models.split(","):
        for batch in (args.small, None):
            try:
                rows.append(one(spec, batch, gpu, args.repeats))
            except Exception as exc:  # one model failing leaves the others
                rows.append(
                    {"model": spec, "batch": batch, "error": f"{type(exc).__name__}: {exc}"}
                )
    write_results(args.out, {"host_rates": dict(gpu.achievable.host), "rows": rows})
    print(f"{'model':<28} {'batch':<16} {'issue ms':>9} {'host pred':>9} {'ratio':>6} "
          f"{'wall ms':>8} {'busy ms':>8} {'pred wall':>9} {'pred GPU':>9}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<28} {r['error'][:100]}")
            continue
        pred = r["predicted_host_s"] or float("nan")
        busy = r["measured_gpu_busy_s"] or float("nan")
        print(
            f"{r['model'][:28]:<28} {str(r['batch'][0])[:16]:<16} "
            f"{r['measured_issue_s'] * 1e3:>9.2f} "
            f"{pred * 1e3:>9.2f} {pred / r['measured_issue_s']:>6.2f} "
            f"{r['measured_wall_s'] * 1e3:>8.2f} {busy * 1e3:>8.2f} "
            f"{(r['predicted_wall_s'] or 0) * 1e3:>9.2f} {(r['predicted_gpu_s'] or 0) * 1e3:>9.2f}"
        )


if __name__ == "__main__":
    main()
