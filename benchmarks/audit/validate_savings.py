"""Do the audit's estimated savings hold on this GPU? Each rule's textbook case, as is and
fixed, timed side by side against the saving the audit predicts for it.

    python benchmarks/audit/validate_savings.py [--quick] [--cases tc-align,nchw-conv]
    python benchmarks/audit/validate_savings.py --model hf:bert [--mode compile]

For each case:
1. correctness first: the fixed variant computes what the original does (outputs compared, in
   eval mode where dropout would differ; a padded layer's extra columns sliced away);
2. the audit runs on the original (meta trace, this GPU's catalog spec calibrated by its
   shipped profile when there is one) and gives est_saving_s for the rule;
3. the original and the fixed variant are timed alternately (gpushape.bench.compare, CUDA
   events, medians), one training step each: forward, then torch.autograd.grad of the output
   (a fixed random gradient) with respect to every parameter and input that needs one;
4. measured saving = median(original) - median(fixed); on CUDA also with both steps replayed
   from CUDA graphs ("graph": GPU time alone, which is what the cost model prices; the eager
   figure adds the host's Python, launch and autograd cost, which decides single-op steps).
Writes $OUT/validate_savings.json (default ./out) and prints the table last: predicted and
measured saving in ms and as a share of the original step, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.auditing import audit  # noqa: E402
from gpushape.auditing.context import BackendFlags  # noqa: E402
from gpushape.auditing.target import resolve_target  # noqa: E402
from gpushape.bench import compare, cuda_graph, write_results  # noqa: E402
from gpushape.hardware import current_gpu  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its cases, beside this
from _savings_cases import CASES, Case, Variant  # noqa: E402


def check(case: Case, a: Variant, b: Variant) -> float:
    """Largest difference between the two outputs, relative to the original's largest value."""
    for v in (a, b):
        v.model.train(case.check_train)
    with torch.no_grad():
        ya, yb = a.check(a.model(*a.inputs)).float(), b.check(b.model(*b.inputs)).float()
    for v in (a, b):
        v.model.train(True)
    err = ((ya - yb).abs().max() / ya.abs().max().clamp_min(1e-6)).item()
    if not err <= case.atol:
        raise AssertionError(f"{case.name}: the fixed variant differs by {err:.3g} (relative)")
    return err


def step(v: Variant, grad_out: torch.Tensor) -> Callable[[], None]:
    """One training step: forward, then gradients of every parameter and input needing one."""
    leaves = [p for p in v.model.parameters() if p.requires_grad]
    leaves += [t for t in v.inputs if t.requires_grad]

    def run() -> None:
        out = v.model(*v.inputs)
        torch.autograd.grad(out, leaves, grad_out, allow_unused=True)

    return run


def predicted(case: Case, a: Variant, target) -> tuple[float | None, float]:
    flags = case.flags or BackendFlags.current()
    inputs = tuple(
        torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta").requires_grad_(
            t.requires_grad
        )
        for t in a.inputs
    )  # keep requires_grad
    report = audit(a.model, inputs, target, dtype=None, train=True, flags=flags, rules=[case.rule])
    savings = [f.est_saving_s for f in report.findings if f.est_saving_s is not None]
    return (sum(savings) if savings else None), report.totals.roofline_time_s


def set_flags(flags: BackendFlags | None) -> tuple[bool, bool]:
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if flags is not None:
        torch.backends.cuda.matmul.allow_tf32 = flags.matmul_tf32
        torch.backends.cudnn.allow_tf32 = flags.cudnn_tf32
    return old


def run_case(case: Case, args, target) -> dict:
    a, b = case.build(args.device, args.scale)
    err = check(case, a, b)
    saving_s, step_s = predicted(case, a, target)
    old = set_flags(case.flags)
    try:
        steps = {
            name: step(v, torch.randn_like(v.model(*v.inputs)))  # a gradient of each
            for name, v in (("as_is", a), ("fixed", b))
        }  # output's own shape
        timings = compare(
            steps, rounds=args.rounds, repeats_per_round=args.repeats, warmup=3, device=args.device
        )
        graph = None
        if args.device.startswith("cuda") and case.rule != "launch-bound":  # that one IS graphs
            try:
                replays = {name: cuda_graph(fn) for name, fn in steps.items()}
                graph = compare(
                    replays,
                    rounds=args.rounds,
                    repeats_per_round=args.repeats,
                    warmup=3,
                    device=args.device,
                )
            except Exception as exc:  # a step that cannot be captured keeps its eager figure
                torch.cuda.synchronize()
                print(
                    f"  {case.rule}: no CUDA-graph timing ({type(exc).__name__}: {str(exc)[:100]})",
                    file=sys.stderr,
                )
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    as_is, fixed = timings["as_is"].median_s, timings["fixed"].median_s
    row = {
        "rule": case.rule,
        "case": case.name,
        "max_rel_error": err,
        "predicted_saving_s": saving_s,
        "predicted_step_s": step_s,
        "measured_as_is_s": as_is,
        "measured_fixed_s": fixed,
        "measured_saving_s": as_is - fixed,
        "timings_s": {k: list(t.times_s) for k, t in timings.items()},
        "method": timings["as_is"].method,
    }
    if graph is not None:
        row.update(
            graph_as_is_s=graph["as_is"].median_s,
            graph_fixed_s=graph["fixed"].median_s,
            graph_saving_s=graph["as_is"].median_s - graph["fixed"].median_s,
        )
    return row


def table(rows: list[dict]) -> str:
    head = (
        f"{'rule':<24} {'pred ms':>9} {'meas ms':>9} {'pred/meas':>9} "
        f"{'pred share':>10} {'meas share':>10} {'graph ms':>9} {'pred/graph':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r.get('case', r['rule']):<24} {r['error'][:70]}")
            continue
        pred, meas = r["predicted_saving_s"], r["measured_saving_s"]
        ratio = f"{pred / meas:9.2f}" if pred is not None and meas > 0 else f"{'-':>9}"
        pshare = f"{pred / r['predicted_step_s']:10.1%}" if pred is not None else f"{'-':>10}"
        g = r.get("graph_saving_s")
        graph = f"{g * 1e3:9.3f}" if g is not None else f"{'-':>9}"
        gratio = (
            f"{pred / g:10.2f}" if g is not None and pred is not None and g > 0 else f"{'-':>10}"
        )
        lines.append(
            f"{r.get('case', r['rule']):<24} {(pred or 0) * 1e3:9.3f} "
            f"{meas * 1e3:9.3f} {ratio} {pshare} "
            f"{meas / r['measured_as_is_s']:10.1%} {graph} {gratio}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--cases",
        help="comma-separated case names: rule ids, or 'unfused-norm-act (BN)' (default: all)",
    )
    parser.add_argument("--device", default="cuda", help="cpu smoke-tests the script")
    parser.add_argument("--scale", type=int, default=1, help="divide batch sizes by this")
    parser.add_argument(
        "--model",
        help="any MODEL (zoo, file.py:factory, hf:, timm:): every fix the audit names for it, "
        "applied one by one and measured (gpushape bench MODEL --optimize) instead of the cases",
    )
    parser.add_argument("--mode", default="eager", choices=("eager", "compile"))
    args = parser.parse_args()
    if args.model:  # the loop, as `gpushape bench MODEL --optimize` runs it
        from gpushape.cli.main import main as gpushape

        out = Path(os.environ.get("OUT", "./out")) / "validate_savings.json"
        cli = ["bench", args.model, "--device", args.device, "--optimize", "--mode", args.mode]
        raise SystemExit(gpushape([*cli, "-o", str(out)]))
    args.rounds, args.repeats = (3, 5) if args.quick else (5, 10)
    cuda = args.device.startswith("cuda")
    spec = current_gpu() if cuda else None
    target = resolve_target(spec.name if spec else "h100", "auto")
    spec, calibration = target.spec, target.calibration
    wanted = args.cases.split(",") if args.cases else list(CASES)
    rows = []
    for name in wanted:
        case = CASES[name]
        if case.cuda_only and not cuda:
            continue
        print(f"... {name}", file=sys.stderr, flush=True)
        try:
            rows.append(run_case(case, args, target))
        except Exception as exc:  # one broken case must not hide the others' results
            rows.append({"rule": case.rule, "case": name, "error": f"{type(exc).__name__}: {exc}"})
        torch.cuda.empty_cache() if cuda else None
    out = Path(os.environ.get("OUT", "./out")) / "validate_savings.json"
    write_results(
        out, rows, gpu_spec=spec.name, calibration=calibration, quick=args.quick, scale=args.scale
    )
    method = next((r["method"] for r in rows if "method" in r), "-")
    print(
        f"audit savings predicted for {spec.full_name} ({calibration or 'datasheet'}) and "
        f"measured here, one training step, medians of {args.rounds * args.repeats} "
        f"({method}):"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
