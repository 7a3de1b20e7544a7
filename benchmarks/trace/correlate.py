"""Does the roofline rank modules as the GPU does? Predicted against measured time per module.

Training steps (forward + backward of every output seeded with ones, as gpushape traces them;
no optimizer) of ResNet-50 (bf16, channels_last, batch 64) and BERT-base (bf16, seq 512,
batch 16), built on the GPU from gpushape.models:
1. Correctness first: one step on CUDA gives finite outputs and gradients, and gpushape's trace
   of the CUDA model with real tensors does the same GEMM FLOPs as its meta trace.
2. Predicted: gpushape.cost(meta trace, GPU, math="bf16") with GPU = this device calibrated by
   the profile gpushape ships for it (its measured ceilings and eager-kernel efficiencies; the
   datasheet with --datasheet), per module (ops go to the
   innermost module; backward ops to the module of their forward op): `kernel_time_s` (device
   time, what the profiler sees) and `roofline_time_s` (+ launch overhead).
3. Measured: torch.profiler over --steps steps after warm-up; each kernel's device time goes to
   the op that launched it and that op to a module (_attribution.py); per step.
4. Spearman rank correlation over modules with measured time (ranks by numpy), total predicted /
   measured, and the step time with CUDA events (gpushape.bench.time_fn, median) without the
   profiler. Writes $OUT/correlate.json and $OUT/correlate.png; prints a short table last.

    OUT=out python benchmarks/trace/correlate.py [--quick] [--models resnet50,bert-base]
    (models: resnet50, bert-base, bert-base-manual, resnet50-nchw, or any MODEL the CLI takes:
    hf:<type>, timm:<name>, file.py:factory; --stem names the files; --channels-last converts
    a library model with image inputs, and its inputs, to channels_last, as the zoo's resnet50
    always is: library models run as built, NCHW, by default)
    python benchmarks/trace/correlate.py --device cpu --quick   # checks the plumbing, no GPU
    (--profile P: calibrated by that profile, the GPU's own, e.g. one `gpushape probe` wrote;
    --ops: each module's ops too, both sides, for op_breakdown.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _attribution import module_ranges, spearman, time_per_module, time_per_module_op
from _correlate_report import plot, print_table

import gpushape
from gpushape.bench import time_fn, write_results
from gpushape.hardware import current_gpu, get_gpu, load_profile
from gpushape.hardware.profile import calibrated
from gpushape.models import create_model, resolve_model

SIZES = {  # name: (full batch, quick batch, options)
    "resnet50": (64, 16, {}),
    "bert-base": (16, 4, {"seq_len": 512}),
    # attention written out (matmul, softmax, dropout, matmul): what manual-attention prices
    "bert-base-manual": (16, 4, {"seq_len": 512, "attention": "manual"}),
    # ResNet-50 left in NCHW: what nchw-conv prices (BatchNorm and pooling at their NCHW rates)
    "resnet50-nchw": (64, 16, {}),
}
CPU_SIZES = {
    "resnet50": (2, {"image_size": 64}),
    "bert-base": (1, {"seq_len": 32, "layers": 2}),
    "bert-base-manual": (1, {"seq_len": 32, "layers": 2, "attention": "manual"}),
    "resnet50-nchw": (2, {"image_size": 64}),
}


def build(
    name: str,
    batch: int | None,
    options: dict,
    device: str,
    dtype=torch.bfloat16,
    channels_last: bool = False,
):
    if name not in SIZES:  # any MODEL: hf:<type>, timm:<name>, file.py:factory, module:factory
        resolved = resolve_model(name, batch=batch, dtype=dtype, device=device)
        model, inputs = resolved.model, resolved.example_inputs
        return to_channels_last(model, inputs) if channels_last else (model, inputs)
    model, inputs = create_model(
        name.removesuffix("-manual").removesuffix("-nchw"),
        batch=batch,
        dtype=dtype,
        device=device,
        **options,
    )
    if name.startswith("resnet") and not name.endswith("-nchw"):  # cuDNN's fast path
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs)
    return model, inputs


def to_channels_last(model, inputs):
    """A model taking image batches (a 4-D floating input) and those inputs in channels_last;
    any other model as it is."""
    images = [
        x for x in inputs if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point()
    ]
    if not images:
        return model, inputs
    model = model.to(memory_format=torch.channels_last)
    inputs = tuple(
        x.contiguous(memory_format=torch.channels_last) if any(x is i for i in images) else x
        for x in inputs
    )
    return model, inputs


def _images_channels_last(inputs) -> bool:
    """Whether the model ran on channels_last image batches."""
    return any(
        isinstance(x, torch.Tensor)
        and x.dim() == 4
        and x.stride(1) == 1 < x.shape[1]
        and x.is_contiguous(memory_format=torch.channels_last)
        for x in inputs
    )


def first_tensor(out) -> torch.Tensor:
    """A model's output tensor (a library model's output object: its first tensor, the logits),
    as gpushape's trace seeds the backward from."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.to_tuple() if hasattr(out, "to_tuple") else out
    return next(v for v in values if isinstance(v, torch.Tensor))


def train_step(model, inputs) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    out = first_tensor(model(*inputs))
    out.backward(torch.ones_like(out))  # the seed gpushape's trace uses
    return out


def gemm_flops(trace) -> int:
    report = gpushape.cost(trace, "h100")
    return sum(op.gemm_flops for op in report.ops)


def check(name, model, inputs, meta_trace, device) -> dict:
    out = train_step(model, inputs)
    grads_finite = all(
        torch.isfinite(p.grad).all().item() for p in model.parameters() if p.grad is not None
    )
    assert torch.isfinite(out).all().item() and grads_finite, f"{name}: non-finite step"
    real = gpushape.trace(model, inputs, train=True, device=device)
    real_flops, meta_flops = gemm_flops(real), gemm_flops(meta_trace)
    # on the CPU attention runs PyTorch's math path, where the meta trace takes the fused kernel
    # CUDA would (a causal one skips half the scores): equal FLOPs are asked of CUDA runs only
    if device == "cuda":
        assert abs(real_flops - meta_flops) <= 0.01 * meta_flops, (name, real_flops, meta_flops)
    return {
        "finite": True,
        "gemm_flops_real_trace": real_flops,
        "gemm_flops_meta_trace": meta_flops,
    }


def predict(meta_trace, gpu) -> tuple[dict, dict]:
    report = gpushape.cost(meta_trace, gpu, math="bf16")
    ops: dict[str, dict[str, float]] = {}
    for op in report.ops:  # per module, per op (forward and backward apart): kernel seconds
        if op.kernel_time_s > 0 and op.module:
            key = f"{op.op} ({op.phase})"
            mine = ops.setdefault(op.module, {})
            mine[key] = mine.get(key, 0.0) + op.kernel_time_s
    per_module = {
        path: {
            "type": m.module_type,
            "kernel_time_s": m.total.kernel_time_s,
            "roofline_time_s": m.total.roofline_time_s,
            "flops": m.total.flops,
            "min_bytes": m.total.min_bytes,
            "ops": ops.get(path, {}),
        }
        for path, m in report.by_module().items()
    }
    totals = report.totals
    return per_module, {
        "kernel_time_s": totals.kernel_time_s,
        "roofline_time_s": totals.roofline_time_s,
        "kernels": totals.kernels,
    }


def measure(model, inputs, steps: int, device: str) -> dict:
    on_gpu = device == "cuda"
    for _ in range(3):
        train_step(model, inputs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with module_ranges(model), profile(activities=activities) as prof:
        for _ in range(steps):
            train_step(model, inputs)
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.events()
    per_module, unattributed, total = time_per_module(events, device=on_gpu)
    per_op = time_per_module_op(events, device=on_gpu)
    timing = time_fn(
        lambda: train_step(model, inputs), warmup=2, repeats=max(steps, 5), device=device
    )
    return {
        "per_module_s": {k: v / steps for k, v in per_module.items()},
        "per_module_op_s": {m: {o: t / steps for o, t in ops.items()} for m, ops in per_op.items()},
        "unattributed_s": unattributed / steps,
        "total_s": total / steps,
        "step_median_s": timing.median_s,
        "step_method": timing.method,
        "what": "kernel device time" if on_gpu else "CPU self time of aten ops",
    }


def compare(predicted: dict, measured: dict) -> dict:
    rows = [
        (path, p["type"], p["kernel_time_s"], p["roofline_time_s"], measured["per_module_s"][path])
        for path, p in predicted.items()
        if measured["per_module_s"].get(path, 0) > 0 and p["kernel_time_s"] > 0
    ]
    pred_k = [r[2] for r in rows]
    pred_r = [r[3] for r in rows]
    meas = [r[4] for r in rows]
    return {
        "modules": len(rows),
        "spearman_kernel_time": spearman(pred_k, meas),
        "spearman_roofline_time": spearman(pred_r, meas),
        "rows": [
            {
                "module": r[0],
                "type": r[1],
                "predicted_kernel_s": r[2],
                "predicted_roofline_s": r[3],
                "measured_s": r[4],
            }
            for r in rows
        ],
        "modules_predicted_not_measured": sorted(
            path
            for path, p in predicted.items()
            if p["kernel_time_s"] > 0 and measured["per_module_s"].get(path, 0) <= 0
        ),
    }


def run_model(name: str, args, gpu) -> dict:
    if args.device == "cuda":  # other MODELs at their own default sizes (`resolve_model`)
        full, quick, options = SIZES.get(name, (None, None, {}))
        batch, dtype = (quick if args.quick else full), torch.bfloat16
    else:  # plumbing check: fp32, as bf16 convolutions crawl on CPUs
        (batch, options), dtype = CPU_SIZES.get(name, (None, {})), torch.float32
    model, inputs = build(name, batch, options, args.device, dtype, args.channels_last)
    meta_model, meta_inputs = build(name, batch, options, "meta", dtype, args.channels_last)
    meta_trace = gpushape.trace(meta_model, meta_inputs, train=True, name=name)
    correctness = check(name, model, inputs, meta_trace, args.device)
    predicted, predicted_totals = predict(meta_trace, gpu)
    measured = measure(model, inputs, args.steps, args.device)
    result = compare(predicted, measured)
    result.update(
        model=name,
        batch=batch,
        options=options,
        channels_last=_images_channels_last(inputs),
        correctness=correctness,
        predicted_total_kernel_s=predicted_totals["kernel_time_s"],
        predicted_total_roofline_s=predicted_totals["roofline_time_s"],
        measured_total_s=measured["total_s"],
        measured_unattributed_s=measured["unattributed_s"],
        measured_step_median_s=measured["step_median_s"],
        measured_what=measured["what"],
        ratio_kernel=predicted_totals["kernel_time_s"] / measured["total_s"],
        ratio_roofline_vs_step=predicted_totals["roofline_time_s"] / measured["step_median_s"],
    )
    if args.ops:  # each compared module's ops, both sides (benchmarks/trace/op_breakdown.py)
        result["ops"] = {
            r["module"]: {
                "predicted_s": predicted[r["module"]]["ops"],
                "measured_s": measured["per_module_op_s"].get(r["module"], {}),
            }
            for r in result["rows"]
        }
    del model, inputs
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="predicted vs measured time per module")
    parser.add_argument("--models", default="resnet50,bert-base")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller batches, 3 steps")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--datasheet",
        action="store_true",
        help="the catalog's datasheet numbers, not the shipped profile",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="calibrate by this profile (this GPU's own: `gpushape probe -o`), not the shipped one",
    )
    parser.add_argument(
        "--flat-memory",
        action="store_true",
        help="the profile without its eager-kernel efficiencies (every memory "
        "family at the copy rate); writes correlate-flat-memory.*",
    )
    parser.add_argument(
        "--stem",
        default=None,
        help="output files' stem (default: correlate, correlate-flat-memory; "
        "with --channels-last, -channels-last added)",
    )
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="library models with image inputs (timm:, hf: vision) and their inputs in "
        "channels_last (default: as built, NCHW)",
    )
    parser.add_argument(
        "--ops",
        action="store_true",
        help="also keep each module's ops, predicted and measured (the JSON's `ops`; "
        "benchmarks/trace/op_breakdown.py reads them)",
    )
    args = parser.parse_args()
    if args.quick:
        args.steps = min(args.steps, 3)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("correlate.py: no CUDA device (use --device cpu to check the plumbing)")
    gpu = current_gpu() if args.device == "cuda" else get_gpu("h200")
    if args.profile is not None:
        theirs = load_profile(args.profile)
        if args.device == "cuda" and theirs.name != gpu.name:
            sys.exit(
                f"correlate.py: {args.profile} is {theirs.name}'s profile; this GPU is {gpu.name}"
            )
        gpu = theirs
    elif not args.datasheet:
        gpu = calibrated(gpu)
    stem = "correlate"
    if args.flat_memory:
        gpu = gpu.replace(achievable=dataclasses.replace(gpu.achievable, memory_efficiency={}))
        stem = "correlate-flat-memory"
    stem = args.stem or (f"{stem}-channels-last" if args.channels_last else stem)
    out_dir = Path(os.environ.get("OUT", "out"))
    results = [run_model(name, args, gpu) for name in args.models.split(",")]
    write_results(
        out_dir / f"{stem}.json",
        results,
        gpu_spec=gpu.name,
        profile=str(args.profile) if args.profile else "shipped" if not args.datasheet else None,
        memory_efficiency=dict(gpu.achievable.memory_efficiency),
        method="torch.profiler device time per module (forward: module ranges; "
        "backward: autograd sequence numbers), mean over steps; step time "
        "median of CUDA events",
    )
    plot(results, out_dir / f"{stem}.png")
    ok = print_table(results)
    print(f"wrote {out_dir / stem}.json and {stem}.png" + ("" if ok else " (NaN rho)"))


if __name__ == "__main__":
    main()
