"""Where the host's time goes in a real eager step, op by op, against the host model's rates.

host_validate.py found the host model (tracing/host.py) right on BERT and short by 1.5-2.1x
on GPT-2, ViT and ResNet-50 at a small batch. For each MODEL, at --batch (small: the host sets
the pace), bf16 on CUDA: the seconds Python takes to issue the forward (with the loss) and the
backward, unprofiled, medians of --repeats, every model before any profiler runs in the process
(`forward_s`, `backward_s`: a profiler session may leave the host's dispatch slower; the first
model is timed again at the end to show whether it did), and again just before its own
profile (`*_late_s`); then torch.profiler (CPU only) over --steps steps:
every top-level op of the forward (an ATen call not inside another) and every node the
autograd engine ran in the backward, by name, calls and inclusive microseconds a step; and
the meta trace's ops by host class with the rates the shipped profile prices them at. The
profiler inflates every op by its own bookkeeping: the unprofiled issue times say by how much.

    python benchmarks/steps/host_by_op.py --models timm:resnet50,hf:gpt2 --out $OUT/host_by_op.json
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import gpushape
from gpushape.bench import write_results
from gpushape.hardware.profile import calibrated
from gpushape.models import resolve_model
from gpushape.probe.host_glue import issue_seconds
from gpushape.steps import synthetic_batch
from gpushape.tracing.host import module_calls, rate, record_class

MODELS = "timm:resnet50,timm:efficientnet_b0,hf:gpt2,timm:vit_base_patch16_224,hf:bert"
BACKWARD = "autograd::engine::evaluate_function: "


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profiled_ops(model, batch, steps: int) -> dict:
    """Top-level forward ops and backward nodes by name: [calls, inclusive us] a step."""
    fwd_ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    bwd_ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    spans = {"forward": 0.0, "backward": 0.0}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            for p in model.parameters():
                p.grad = None
            _sync()
            with torch.profiler.record_function("gpushape::forward"):
                loss = batch.loss(model(*batch.inputs, **batch.kwargs))
            _sync()
            with torch.profiler.record_function("gpushape::backward"):
                loss.backward()
            _sync()
    for e in prof.events():
        if e.name in ("gpushape::forward", "gpushape::backward"):
            spans[e.name.split("::")[1]] += e.cpu_time_total / steps
            continue
        parent = e.cpu_parent
        if e.name.startswith(BACKWARD):
            row = bwd_ops[e.name[len(BACKWARD) :]]
        elif parent is not None and parent.name == "gpushape::forward":
            row = fwd_ops[e.name]
        else:
            continue
        row[0] += 1 / steps
        row[1] += e.cpu_time_total / steps
    return {
        "profiled_forward_us": spans["forward"],
        "profiled_backward_us": spans["backward"],
        "forward_ops": dict(sorted(fwd_ops.items(), key=lambda kv: -kv[1][1])),
        "backward_nodes": dict(sorted(bwd_ops.items(), key=lambda kv: -kv[1][1])),
    }


def predicted(model, inputs, rates) -> dict:
    """The meta trace's ops by host class and pass: [count, seconds at the profile's rates]."""
    trace = gpushape.trace(model, inputs, train=True)
    by: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for r in trace.ops:
        if r.kind == "view":
            row = by[f"view/{r.phase}"]
            row[0] += 1
            row[1] += rates["view"]
        elif r.kind == "compute":
            back = r.phase == "backward"
            cls = record_class(r)
            row = by[f"{cls}/backward" if back else cls]
            row[0] += 1
            row[1] += rate(rates, cls, back)
    n = module_calls(trace)
    by["module"] = [n, n * rates["module"]]
    ops = defaultdict(int)
    for r in trace.ops:
        if r.kind == "compute":
            ops[f"{r.phase}:{r.op}"] += 1
    return {"by_class": dict(by), "ops": dict(ops)}


HOLD = {"s": 0.0}  # --hold: the GPU held busy while each pass is issued (0: not held)


def _built(spec: str, batch_size: int, device: str):
    real = resolve_model(spec, batch=batch_size or None, dtype=torch.bfloat16, device=device)
    return real.model, synthetic_batch(real.model, real.example_inputs)


def _issue(spec: str, batch_size: int, repeats: int, device: str) -> tuple[float, float]:
    model, batch = _built(spec, batch_size, device)
    out = issue_seconds(model, batch.inputs, repeats, kwargs=batch.kwargs, loss=batch.loss,
                        hold_s=HOLD["s"])  # fmt: skip
    del model, batch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def profiled(spec: str, batch_size: int, rates, repeats: int, steps: int, device: str) -> dict:
    """The model timed again (after the profiler sessions of the models before it), then
    profiled, and its meta trace priced."""
    model, batch = _built(spec, batch_size, device)
    out: dict = {}
    out["forward_late_s"], out["backward_late_s"] = issue_seconds(
        model, batch.inputs, repeats, kwargs=batch.kwargs, loss=batch.loss, hold_s=HOLD["s"]
    )
    out.update(profiled_ops(model, batch, steps))
    meta = resolve_model(spec, batch=batch_size or None, dtype=torch.bfloat16, device="meta")
    out["predicted"] = predicted(meta.model, meta.example_inputs, rates)
    del model, batch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=MODELS)
    p.add_argument("--batch", type=int, default=2, help="0: each model's default batch")
    p.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="seconds the GPU is held busy while each pass is issued, so that a "
        "batch whose kernels outlast their issue cannot make the host wait",
    )
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="host_by_op.json")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    args = p.parse_args()
    HOLD["s"] = args.hold
    rates = dict(calibrated("h200").achievable.host)
    specs = args.models.split(",")
    rows: list[dict] = []
    # every model timed before any profiler runs in the process (`forward_s`, `backward_s`),
    # then each timed again and profiled (`*_late_s`), then the first timed once more: the
    # drift a profiler session leaves in the host's dispatch, if any
    for spec in specs:
        try:
            fwd, bwd = _issue(spec, args.batch, args.repeats, args.device)
            rows.append({"model": spec, "batch": args.batch, "forward_s": fwd, "backward_s": bwd})
        except Exception as exc:  # one model failing leaves the others
            rows.append({"model": spec, "error": f"{type(exc).__name__}: {exc}"})
    for row in rows:
        if "error" not in row:
            row.update(profiled(row["model"], args.batch, rates, args.repeats, args.steps,
                                args.device))  # fmt: skip
        write_results(args.out, {"host_rates": rates, "rows": rows})
    first = next((r for r in rows if "error" not in r), None)
    if first is not None:
        first["forward_again_s"], first["backward_again_s"] = _issue(
            first["model"], args.batch, args.repeats, args.device
        )
        write_results(args.out, {"host_rates": rates, "rows": rows})
    head = f"{'prof fwd':>8} {'prof bwd':>8} {'fwd ops':>7} {'bwd nodes':>9} {'pred ms':>7}"
    print(f"{'model':<28} {'fwd ms':>7} {'bwd ms':>7} {'late':>6} {'late':>6} {head}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<28} {r['error'][:100]}")
            continue
        pred = sum(v[1] for v in r["predicted"]["by_class"].values())
        print(
            f"{r['model'][:28]:<28} {r['forward_s'] * 1e3:>7.2f} {r['backward_s'] * 1e3:>7.2f} "
            f"{r['forward_late_s'] * 1e3:>6.2f} {r['backward_late_s'] * 1e3:>6.2f} "
            f"{r['profiled_forward_us'] / 1e3:>8.2f} {r['profiled_backward_us'] / 1e3:>8.2f} "
            f"{sum(v[0] for v in r['forward_ops'].values()):>7.0f} "
            f"{sum(v[0] for v in r['backward_nodes'].values()):>9.0f} {pred * 1e3:>7.2f}"
        )
    if first is not None:
        before = first["forward_s"] + first["backward_s"]
        again = first["forward_again_s"] + first["backward_again_s"]
        print(f"{first['model']}: {before * 1e3:.2f} ms to issue a step before any profiler ran, "
              f"{again * 1e3:.2f} ms after ({again / before:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
