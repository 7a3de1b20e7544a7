"""What each piece of an eager fused-op call costs the host, on one GPU.

    python benchmarks/kernels/host_costs.py [--calls 2000] [--out host_costs.json]

Tiny shapes (the GPU finishes each kernel in a few microseconds), so a call's time is the
host's: allocation, Triton's launch path, the autograd Function and engine, and the whole eager
forward+backward of rms_norm and batch_norm_act against PyTorch's own ops. Each figure is the
median over 5 repeats of `calls` back-to-back calls, microseconds per call.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import json
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench.record import environment
from gpushape.kernels import BatchNormAct2d, rms_norm
from gpushape.kernels.norms import _common as norm_common
from gpushape.kernels.norms._launch import forward_plan


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def on_worker(x, dy, work=None):
    """A fwd+bwd through an identity Python autograd.Function whose backward, run on autograd's
    device thread, calls `work` first (nothing: the engine's own cost)."""

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            if work is not None:
                work()
            return g

    return lambda: torch.autograd.grad(Identity.apply(x), (x,), dy)


def breakdown(title: str, step, targets: dict[str, tuple[object, str]], calls: int) -> None:
    """Time spent inside each layer of `step` (an eager forward+backward): a timer wrapped
    around each target (an object and attribute: a module function, a Function's static
    forward or backward), the whole step timed too. Microseconds per step."""
    spent: dict[str, float] = {}

    def timed(name, f):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return wrapper

    saved = {name: (obj, attr, obj.__dict__[attr]) for name, (obj, attr) in targets.items()}
    for name, (obj, attr, original) in saved.items():
        f = original.__func__ if isinstance(original, staticmethod) else original
        wrapped = timed(name, f)
        setattr(obj, attr, staticmethod(wrapped) if isinstance(original, staticmethod) else wrapped)
    whole = timed("whole step", step)
    try:
        for _ in range(20):
            whole()
        torch.cuda.synchronize()
        spent.clear()
        for _ in range(calls):
            whole()
        torch.cuda.synchronize()
    finally:
        for obj, attr, original in saved.values():
            setattr(obj, attr, original)
    print(f"{title}, time inside each layer (us per step):")
    for name, total in spent.items():
        print(f"  {name:40s} {total / calls * 1e6:8.2f}")


def pieces(calls: int) -> dict[str, float]:
    import triton
    from triton.runtime import driver

    dev = torch.device("cuda")
    x = torch.randn(64, 16384, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(16384, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    xd = x.detach()
    out: dict[str, float] = {}

    def put(name, fn):
        out[name] = per_call_us(fn, calls)
        print(f"{name:48s} {out[name]:8.2f} us", flush=True)

    put(
        "torch.empty (64, 16384) bf16",
        lambda: torch.empty((64, 16384), device=dev, dtype=torch.bfloat16),
    )
    put("torch.empty_like", lambda: torch.empty_like(xd))
    put("torch._C._cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0))
    put(
        "triton get_current_device+stream",
        lambda: driver.active.get_current_stream(driver.active.get_current_device()),
    )
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        put("triton knobs.runtime.launch_enter_hook", lambda: knobs.runtime.launch_enter_hook)
    put("torch.cuda.is_current_stream_capturing", torch.cuda.is_current_stream_capturing)

    # one launch of rms_norm's forward kernel, through gpushape's Launch and below it
    y = norm_common.norm_forward(xd, None, w.detach(), None, 1e-6, act=0, rms=True)
    plan = forward_plan(xd, False, w, None, act=0, rms=True)
    rstd = y.rstd
    ptrs = (xd, xd, xd, y.y, w.detach(), xd, rstd, rstd)
    sizes = (16384, 1e-6) if plan.looped else (64, 16384, 1e-6)
    put("Launch (gpushape fast path, 1 kernel)", lambda: plan.launch(True, *ptrs, *sizes))
    compiled = plan.launch.kernel.warmup(*ptrs, *sizes, grid=plan.launch.grid, **plan.launch.meta)
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    grid = plan.launch.grid + (1,) * (3 - len(plan.launch.grid))
    consts = plan.launch.consts
    stream = torch._C._cuda_getCurrentRawStream(0)
    run = compiled.run
    put(
        "CompiledKernel.run direct (no runner closure)",
        lambda: run(
            grid[0],
            grid[1],
            grid[2],
            stream,
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *ptrs,
            *sizes,
            *consts,
        ),
    )
    put(
        "norm_forward (allocs + 1 launch)",
        lambda: norm_common.norm_forward(xd, None, w.detach(), None, 1e-6, act=0, rms=True),
    )
    with torch.no_grad():
        put("rms_norm fwd, no grad", lambda: rms_norm(x, w))
    put("rms_norm fwd, Function.apply", lambda: rms_norm(x, w))
    put("F.rms_norm fwd, autograd", lambda: F.rms_norm(x, (16384,), w))
    put("identity Function fwd+bwd (engine baseline)", on_worker(x, dy))
    put("x*2 native fwd+bwd (engine baseline)", lambda: torch.autograd.grad(x * 2, (x,), dy))
    put("rms_norm fwd+bwd (gpushape)", lambda: torch.autograd.grad(rms_norm(x, w), (x, w), dy))
    put(
        "F.rms_norm fwd+bwd (PyTorch)",
        lambda: torch.autograd.grad(F.rms_norm(x, (16384,), w), (x, w), dy),
    )

    # the same backward work on the calling thread, and on autograd's worker thread
    wd = w.detach()
    backward = lambda: norm_common.norm_backward(
        dy, None, xd, wd, None, None, rstd, act=0, rms=True
    )
    launches = lambda: [plan.launch(True, *ptrs, *sizes) for _ in range(3)]
    put("norm_backward direct (calling thread)", backward)
    put("worker thread: norm_backward", on_worker(x, dy, backward))
    put(
        "worker thread: 5 empty_like",
        on_worker(x, dy, lambda: [torch.empty_like(xd) for _ in range(5)]),
    )
    put("worker thread: 3 Launch", on_worker(x, dy, launches))
    put("calling thread: 3 Launch", launches)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    put(
        "rms_norm fwd+bwd, GIL switch interval 1 us",
        lambda: torch.autograd.grad(rms_norm(x, w), (x, w), dy),
    )
    sys.setswitchinterval(switch)
    print("python threads:", [t.name for t in threading.enumerate()], flush=True)
    fn_cls = norm_common._NormFunction
    breakdown(
        "rms_norm fwd+bwd",
        lambda: torch.autograd.grad(rms_norm(x, w), (x, w), dy),
        {
            "norm_forward": (norm_common, "norm_forward"),
            "norm_backward": (norm_common, "norm_backward"),
            "Function.forward body": (fn_cls, "forward"),
            "Function.backward body": (fn_cls, "backward"),
        },
        calls,
    )

    shape = (8, 1024, 14, 14)
    xb = (
        torch.randn(shape, device=dev, dtype=torch.bfloat16)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_()
    )
    rb = torch.randn_like(xb).requires_grad_()
    dyb = torch.randn_like(xb)
    ours = BatchNormAct2d(1024).to(dev)
    bn = torch.nn.BatchNorm2d(1024).to(dev, torch.bfloat16)
    params = [xb, rb, ours.weight, ours.bias]
    with torch.no_grad():
        put("batch_norm_act fwd, no grad", lambda: ours(xb, rb))
    put("batch_norm_act fwd, Function.apply", lambda: ours(xb, rb))
    put("batch_norm_act fwd+bwd (gpushape)", lambda: torch.autograd.grad(ours(xb, rb), params, dyb))
    put(
        "BatchNorm2d+add+relu fwd+bwd (PyTorch)",
        lambda: torch.autograd.grad(F.relu(bn(xb) + rb), [xb, rb, bn.weight, bn.bias], dyb),
    )
    # FusedQKV at BERT-base width, tiny batch: the Triton assembly against autograd's cat
    from gpushape.kernels import FusedQKV
    from gpushape.kernels.attention import fused_qkv as qkv_module

    fq = FusedQKV(768, 12).to(dev, torch.bfloat16)
    xq = torch.randn(1, 16, 768, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gq = [torch.randn(1, 12, 16, 64, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    put(
        "FusedQKV fwd+bwd, Triton assembly",
        lambda: torch.autograd.grad(fq(xq), [xq, fq.weight, fq.bias], gq),
    )
    real = qkv_module.use_triton
    qkv_module.use_triton = lambda *t: False
    try:
        put(
            "FusedQKV fwd+bwd, autograd cat",
            lambda: torch.autograd.grad(fq(xq), [xq, fq.weight, fq.bias], gq),
        )
    finally:
        qkv_module.use_triton = real
    breakdown(
        "FusedQKV fwd+bwd (Triton assembly)",
        lambda: torch.autograd.grad(fq(xq), [xq, fq.weight, fq.bias], gq),
        {
            "_SplitHeads.forward body": (qkv_module._SplitHeads, "forward"),
            "_SplitHeads.backward body": (qkv_module._SplitHeads, "backward"),
            "assemble_heads": (qkv_module, "assemble_heads"),
        },
        calls,
    )
    profiler = cProfile.Profile()
    with torch.no_grad():
        profiler.enable()
        for _ in range(calls):
            ours(xb, rb)
        profiler.disable()
    print(f"cProfile: {calls} batch_norm_act forwards, no grad (calling thread only)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--sources",
        action="store_true",
        help="also print Triton's launch-path source (to see its signature)",
    )
    args = parser.parse_args()
    if common.cuda_missing("cuda", "host_costs.py"):
        sys.exit(2)
    if args.sources:
        from triton.backends.nvidia import driver as nv
        from triton.compiler import compiler

        print(inspect.getsource(compiler.CompiledKernel.__getitem__))
        print(inspect.getsource(nv.CudaLauncher))
    result = {
        "env": environment(),
        "command": " ".join(sys.argv),
        "calls": args.calls,
        "us_per_call": pieces(args.calls),
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
