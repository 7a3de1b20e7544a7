"""Does `gpushape.optimize` make real training steps faster? Before and after, in one run.

    python benchmarks/transforms/bench_optimize.py \
        --out benchmarks/results/optimize-h200/bench_optimize.json

Cases (bf16 weights, synthetic data on the GPU, a step = forward, backward, optimizer step):
- ResNet-50 as the textbook writes it (torchvision's when it imports, else gpushape's zoo copy:
  NCHW, separate BatchNorm and ReLU), batch 256, SGD with momentum: as written, eager; optimized
  by `gpushape.optimize` (the fixes its audit picks for this GPU), eager; and, for reference,
  torch.compile of the original converted to channels_last (the usual hand fix), with its
  warm-up time.
- GPT-2 124M (Hugging Face, when transformers imports), batch 8 x 1024, fused AdamW: as shipped
  and optimized, eager.
optimize() checks each rewrite numerically on a small batch (the float64 reference of a
batch-256 ResNet would not fit), then the step is timed at the full batch. Variants are
alternated in rounds; medians of CUDA-event timings of 10-step blocks. Eager steps are timed as
a user runs them (host launch cost included); the table says samples/s and the ratio to the
model as written.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import gpushape
from gpushape.bench import write_results


def resnet50(batch: int):
    try:
        import torchvision

        model, source = torchvision.models.resnet50(), "torchvision"
    except ImportError:
        from gpushape.models import create_model

        model, _ = create_model("resnet50", batch=1, device="cpu", dtype=torch.float32)
        source = "gpushape zoo"
    model = model.to("cuda", torch.bfloat16)
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    return model, x, y, source


def resnet_step(model: nn.Module, x, y, compiled: bool = False):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    fwd = torch.compile(model) if compiled else model
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fwd(x).float(), y)
        loss.backward()
        opt.step()

    return step


def gpt2(batch: int, seq: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_positions=seq)).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 50257, (batch, seq), device="cuda")
    return model, ids


def gpt2_step(model: nn.Module, ids):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def timed(steps: dict, rounds: int, block: int) -> dict[str, list[float]]:
    """Seconds per step, per variant: `rounds` rounds, every variant in turn, `block` steps."""
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(block):
                step()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3 / block)
    return times


def warm(step, n: int = 3) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def optimized(model: nn.Module, small_inputs: tuple, **options):
    """The model through gpushape.optimize, checked on `small_inputs`; the report as data."""
    t0 = time.perf_counter()
    model, report = gpushape.optimize(model, small_inputs, dtype=torch.bfloat16, **options)
    info = report.to_dict()
    info["optimize_s"] = time.perf_counter() - t0
    return model, info


def predicted(models: dict, inputs: tuple) -> dict[str, float]:
    """The audit's predicted GPU step (kernels and launches) at the benchmark's batch."""
    return {
        name: gpushape.audit(m, inputs, train=True).totals.roofline_time_s
        for name, m in models.items()
    }


def run_case(name: str, steps: dict, samples: int, args, extra: dict) -> dict:
    warmups = {k: warm(s) for k, s in steps.items()}
    times = timed(steps, args.rounds, args.block)
    base = statistics.median(times["as written"])
    rows = {}
    for variant, ts in times.items():
        med = statistics.median(ts)
        rows[variant] = {
            "median_step_s": med,
            "samples_per_s": samples / med,
            "speedup_vs_as_written": base / med,
            "warmup_s": warmups[variant],
            "step_times_s": ts,
        }
    return {"case": name, "samples_per_step": samples, "variants": rows, **extra}


def resnet_case(args) -> dict:
    torch.backends.cudnn.benchmark = True
    model, x, y, source = resnet50(args.batch)
    original = copy.deepcopy(model)
    small = (x[: args.check_batch].clone(),)
    opt_model, info = optimized(model, small, train=True)
    steps = {
        "as written": resnet_step(original, x, y),
        "gpushape.optimize": resnet_step(opt_model, x, y),
    }
    if args.cl_input:  # what converting the inputs too adds (the transform converts weights)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        steps["gpushape.optimize, channels_last input"] = resnet_step(opt_model, x_cl, y)
    info["predicted_full_batch_s"] = predicted(
        {"as written": original, "gpushape.optimize": opt_model}, (x,)
    )
    if not args.no_compile:
        cl = copy.deepcopy(original).to(memory_format=torch.channels_last)
        steps["torch.compile, channels_last"] = resnet_step(
            cl, x.contiguous(memory_format=torch.channels_last), y, compiled=True
        )
    return run_case(f"ResNet-50 ({source})", steps, args.batch, args, {"optimize": info})


def gpt2_case(args) -> dict | None:
    try:
        model, ids = gpt2(args.gpt2_batch, args.seq)
    except ImportError:
        return None
    original = copy.deepcopy(model)
    opt_model, info = optimized(model, (ids[:1, :128].clone(),), train=True)
    steps = {"as written": gpt2_step(original, ids), "gpushape.optimize": gpt2_step(opt_model, ids)}
    info["predicted_full_batch_s"] = predicted(
        {"as written": original, "gpushape.optimize": opt_model}, (ids,)
    )
    tokens = args.gpt2_batch * args.seq
    return run_case("GPT-2 124M (Hugging Face)", steps, tokens, args, {"optimize": info})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_optimize.json")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--check-batch", type=int, default=8)
    p.add_argument("--gpt2-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--cl-input", action="store_true", help="also time channels_last inputs")
    p.add_argument("--cases", default="resnet50,gpt2")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_optimize: needs a CUDA GPU", file=sys.stderr)
        return 2
    cases = []
    if "resnet50" in args.cases:
        cases.append(resnet_case(args))
    if "gpt2" in args.cases:
        case = gpt2_case(args)
        if case:
            cases.append(case)
    write_results(args.out, cases)
    print(f"{'case':34} {'variant':30} {'samples/s':>12} {'x as written':>12} {'warm-up s':>10}")
    for case in cases:
        applied = sorted({c["transform"] for c in case["optimize"]["applied"]})
        for variant, row in case["variants"].items():
            print(
                f"{case['case']:34} {variant:30} {row['samples_per_s']:12,.0f} "
                f"{row['speedup_vs_as_written']:12.2f} {row['warmup_s']:10.1f}"
            )
        print(
            f"  applied: {', '.join(applied) or 'nothing'}; rolled back: "
            f"{case['optimize']['rolled_back'] or 'nothing'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
