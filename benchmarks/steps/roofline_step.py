"""A training step's kernels by class against each class's roofline: can the step reach a
target rate at all on this GPU, and which class stands in the way?

For each variant (built as `gpushape bench --vs` builds it, timed alternately in one run),
torch.profiler gives every kernel of one step; each is put in a class by its name (CLASSES:
convolution, matrix product, normalization, pooling, layout conversion, optimizer,
elementwise and other). The class's roofline comes from gpushape's trace of the variant's own
model: its FLOPs at the GEMM peak `gpushape probe` measured (convolutions, matrix products),
or its minimum bytes (each op's inputs read once and outputs written once) at the measured
copy rate (the rest); the optimizer's, from the parameters' bytes (SGD with momentum: weight,
gradient and momentum read, weight and momentum written). Three bounds on the step:

- every class at its roofline (the physical floor, kernels one after another);
- the compute classes as measured (cuDNN's and cuBLAS's own kernels) and the rest at their
  roofline: what fusing every memory-bound kernel perfectly could give;
- as measured (the kernels alone; the step adds the gaps between them).

Against `--target` (samples a second) the step has batch / target seconds; a target under
the second bound cannot be met by memory-bound fusion alone.

    python benchmarks/steps/roofline_step.py torchvision.models:resnet50 \\
        --input 256x3x224x224 --vs optimize+graph,channels-last+compile --target 8000 \\
        --out $OUT/roofline_resnet50.json
    python benchmarks/steps/roofline_step.py resnet50 --batch 2 --device cpu   # plumbing
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.hardware import calibrated, get_gpu
from gpushape.models import resolve_model
from gpushape.steps import synthetic_batch
from gpushape.steps.measure import time_blocks, warm
from gpushape.steps.variants import build_variant
from gpushape.tracing.cost import cost
from gpushape.tracing.families import memory_family
from gpushape.tracing.tracer import trace

COMPUTE = ("convolution", "matmul")
CLASSES = (  # (class, kernel-name pattern), first match wins
    ("layout", r"nchwToNhwc|nhwcToNchw"),
    ("optimizer", r"multi_tensor_apply|foreach|fused_sgd|FusedSgd|adam|Adam"),
    (
        "normalization",
        r"batch_norm|layer_norm|_stats_kernel|_apply_kernel|_bwd_reduce_kernel|"
        r"_bwd_apply_kernel|welford|rms_norm|GammaBeta",
    ),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit|nhwckrsc|winograd"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|splitK"),
    ("pooling", r"pool"),
    ("elementwise", r"elementwise|vectorized|triton_|reduce_kernel|fill|copy|add|relu|mul"),
)
TRACE_CLASSES = {  # trace op name -> class; the rest by memory family
    "convolution": "convolution",
    "convolution_backward": "convolution",
    "mm": "matmul",
    "addmm": "matmul",
    "bmm": "matmul",
    "_scaled_dot_product_flash_attention": "matmul",
    "_scaled_dot_product_cudnn_attention": "matmul",
}


def kernel_class(name: str) -> str:
    for cls, pattern in CLASSES:
        if re.search(pattern, name):
            return cls
    return "other"


def op_class(rec) -> str:
    if rec.name in TRACE_CLASSES:
        return TRACE_CLASSES[rec.name]
    family = memory_family(rec) or ""
    if "norm" in family:
        return "normalization"
    if "pool" in family:
        return "pooling"
    return "elementwise"


def rooflines(model, inputs, spec) -> dict[str, float]:
    """Seconds each class needs at its roofline, from the trace of `model` (train step)."""
    peak = spec.attainable_flops(next(p.dtype for p in model.parameters()))
    copy_rate = spec.attainable_bandwidth_bytes_per_s()
    traced = trace(model, inputs, train=True)
    by_index = {r.index: r for r in traced.ops}
    out: dict[str, float] = {}
    for c in cost(traced, spec).ops:
        rec = by_index.get(c.index)
        cls = op_class(rec) if rec is not None else "elementwise"
        seconds = c.flops / peak if cls in COMPUTE else c.min_bytes / copy_rate
        out[cls] = out.get(cls, 0.0) + seconds
    params = [p for p in model.parameters() if p.requires_grad]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    out["optimizer"] = 5 * nbytes / copy_rate  # SGD momentum: 3 tensors read, 2 written
    return out


def measured_classes(run, cuda: bool) -> dict[str, float]:
    """Seconds a step's kernels spend in each class (none without CUDA)."""
    if not cuda:
        return {}
    from torch.profiler import ProfilerActivity, profile

    calls = 3
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type.name != "CUDA" or e.name.startswith(("Memcpy", "Memset")):
            continue
        cls = kernel_class(e.name)
        out[cls] = out.get(cls, 0.0) + e.device_time * 1e-6 / calls
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--input", action="append", help="as gpushape's --input, e.g. 256x3x224x224")
    p.add_argument("--batch", type=int)
    p.add_argument("--vs", default="optimize+graph,channels-last+compile")
    p.add_argument("--target", type=float, help="samples a second the step must reach")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpu", default="h200", help="the chip whose profile gives the peaks")
    p.add_argument("--out", default="roofline_step.json")
    args = p.parse_args()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    resolved = resolve_model(args.model, batch=args.batch, dtype=dtype, device=args.device,
                             inputs=args.input)  # fmt: skip
    model, inputs = resolved.model, resolved.example_inputs
    batch = synthetic_batch(model, inputs)
    spec = calibrated(get_gpu(args.gpu))
    variants = {}
    for name in args.vs.split(","):
        v = build_variant(name, model, batch)
        warm(v.run, 3, cuda=cuda)
        variants[name] = v
        print(f"{name}: built", flush=True)
    times = time_blocks({n: v.run for n, v in variants.items()}, rounds=args.rounds,
                        block=10, cuda=cuda)  # fmt: skip
    samples = batch.samples
    rows = {}
    for name, v in variants.items():
        step = statistics.median(times[name])
        roof = rooflines(v.step.model, v.step.batch.inputs, spec)
        meas = measured_classes(v.run, cuda)
        classes = sorted(set(roof) | set(meas), key=lambda c: -meas.get(c, roof.get(c, 0.0)))
        bounds = {
            "all at roofline": sum(roof.values()),
            "compute as measured, rest at roofline": sum(
                meas.get(c, roof.get(c, 0.0)) if c in COMPUTE else roof.get(c, 0.0) for c in classes
            ),
            "kernels as measured": sum(meas.values()) if meas else None,
        }
        rows[name] = {"step_s": step, "samples_per_s": samples / step, "classes": {
            c: {"measured_s": meas.get(c), "roofline_s": roof.get(c)} for c in classes
        }, "bounds_s": bounds}  # fmt: skip
        print(f"\n{name}: step {step * 1e3:.2f} ms, {samples / step:,.0f} samples/s")
        print(f"  {'class':14} {'measured ms':>12} {'roofline ms':>12} {'of roofline':>12}")
        for c in classes:
            m, r = meas.get(c), roof.get(c)
            frac = f"{r / m:.0%}" if m and r else "-"
            print(f"  {c:14} {(m or 0) * 1e3:12.2f} {(r or 0) * 1e3:12.2f} {frac:>12}")
        for what, secs in bounds.items():
            if secs:
                print(f"  {what}: {secs * 1e3:.2f} ms = {samples / secs:,.0f} samples/s at most")
    if args.target:
        need = samples / args.target
        print(f"\n--target {args.target:,.0f} samples/s: a step of {need * 1e3:.2f} ms")
    write_results(args.out, results={"model": args.model, "samples": samples,
                                     "target": args.target, "variants": rows,
                                     "classes": [c for c, _ in CLASSES]})  # fmt: skip


if __name__ == "__main__":
    main()
