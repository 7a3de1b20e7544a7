"""Measurements of tune_batch_norm_act.py: numeric checks, host overhead, GPU time of one call,
the profiler's kernels, default vs tuned end to end."""

from __future__ import annotations

import contextlib
import importlib.util
import statistics
import sys
import time

import _tune_batch_norm_grid as grid
import torch
import torch.nn.functional as F

from gpushape.bench import compare
from gpushape.kernels import BatchNormAct2d, batch_norm_act
from gpushape.kernels import _launch as runtime
from gpushape.kernels.batch_norm._tuning import DEFAULT, BatchNormTuning, batch_norm_tuning

SPIN_CYCLES = 200_000  # GPU clock cycles of the spin kernel before each timed repeat


def load_gate():
    path = grid.ROOT / "tests" / "kernel_ops" / "_numeric.py"
    spec = importlib.util.spec_from_file_location("gpushape_tests_numeric", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.gate_forward_backward


def fwd_bwd(bufs, tuning: BatchNormTuning | None = None):
    """(y, dx, dres, dweight, dbias) of one training step on bufs' tensors."""
    x, r = bufs.x.detach().requires_grad_(), bufs.r.detach().requires_grad_()
    w, b = bufs.w.detach().requires_grad_(), bufs.b.detach().requires_grad_()
    with batch_norm_tuning(tuning) if tuning else contextlib.nullcontext():
        y = batch_norm_act(x, w, b, None, None, True, residual=r)
        return (y.detach(), *torch.autograd.grad(y, [x, r, w, b], bufs.dy))


def check_gate(shape, tuning: BatchNormTuning | None, gate) -> str:
    """TESTING.md's gate at batch 32 (forward and every gradient vs float64)."""
    n, c, h, w = shape
    small = (min(n, 32), c, h, w)
    x = (
        (0.5 * torch.randn(small, device=grid.DEVICE) - 1)
        .to(grid.DTYPE)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_()
    )
    r = torch.randn_like(x).requires_grad_()
    wt = (1 + 0.2 * torch.randn(c, device=grid.DEVICE)).requires_grad_()
    bs = (0.2 * torch.randn(c, device=grid.DEVICE)).requires_grad_()
    with batch_norm_tuning(tuning) if tuning else contextlib.nullcontext():
        results = gate(
            lambda x, r, w, b: batch_norm_act(x, w, b, None, None, True, residual=r),
            lambda x, r, w, b: F.relu(F.batch_norm(x, None, None, w, b, True) + r),
            (x, r, wt, bs),
            names=("x", "residual", "weight", "bias"),
        )
    worst = max(results, key=lambda g: g.err_ours / max(g.bound, 1e-30))
    return f"pass (tightest {worst.name}: {worst.err_ours:.2e} <= {worst.bound:.2e})"


def host_wall_us(fn, calls: int = 20) -> tuple[float, float]:
    """(host us, wall us) per call: queueing `calls` calls, then finishing them (median of 3)."""
    fn()
    host, wall = [], []
    for _ in range(3):
        grid.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        grid.sync()
        host.append((t1 - t0) / calls * 1e6)
        wall.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(host), statistics.median(wall)


def measure_host(shape) -> list[dict]:
    bufs = grid.Buffers.make(shape, fill=True)
    ours = BatchNormAct2d(shape[1]).to(grid.DEVICE)
    bn = torch.nn.BatchNorm2d(shape[1]).to(grid.DEVICE)
    x, r = bufs.x.detach().requires_grad_(), bufs.r.detach().requires_grad_()

    def step(module, fused):
        def run():
            with torch.autocast(grid.DEVICE, dtype=grid.DTYPE):
                y = module(x, r) if fused else F.relu(module(x) + r)
            torch.autograd.grad(y, [x, r, module.weight, module.bias], bufs.dy)

        return run

    def fwd():
        with torch.autocast(grid.DEVICE, dtype=grid.DTYPE):
            ours(x, r)

    rows = []
    for name, fn, fast in (
        ("gpushape fwd", fwd, True),
        ("gpushape fwd+bwd", step(ours, True), True),
        ("gpushape fwd+bwd, JIT launch", step(ours, True), False),
        ("eager fwd+bwd", step(bn, False), True),
    ):
        runtime.FAST_LAUNCH = fast
        host, wall = host_wall_us(fn)
        rows.append(dict(shape=list(shape), variant=name, host_us=host, wall_us=wall))
    runtime.FAST_LAUNCH = True
    return rows


def fast_equals_jit(bufs) -> str:
    """Whether the direct launcher gives the JIT launch's bits (and stayed on)."""
    if grid.DEVICE != "cuda":
        return "not exercised (the interpreter has no compiled kernels)"
    runtime.FAST_LAUNCH = False
    slow = fwd_bwd(bufs)
    runtime.FAST_LAUNCH = True
    fast = fwd_bwd(bufs)
    if not runtime.FAST_LAUNCH:
        runtime.FAST_LAUNCH = True
        return "FAIL: the direct launcher raised and switched itself off (JIT launches only)"
    same = all(torch.equal(a, b) for a, b in zip(slow, fast))
    return "bit-identical" if same else "FAIL: results differ"


def profile_step(bufs) -> list[dict]:
    """Kernels of one gpushape fwd+bwd: name, calls and device us per step (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fwd_bwd(bufs)
    grid.sync()
    activity = ProfilerActivity.CUDA if grid.DEVICE == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(3):
            fwd_bwd(bufs)
        grid.sync()
    out = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if grid.DEVICE != "cuda" and e.key.startswith("aten::"):
            us = e.cpu_time_total
        if us > 0:
            out.append(dict(kernel=e.key[:60], calls=e.count / 3, us=us / 3))
    return sorted(out, key=lambda d: -d["us"])


def spin_ms() -> float:
    if grid.DEVICE != "cuda":
        return 0.0
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(SPIN_CYCLES)
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e)


def gpu_ms(fn, repeats: int, spin: float) -> tuple[float, bool]:
    """(median GPU ms of fn, whether the host queued it within the spin): each repeat is
    queued behind a spin kernel, so the events time the GPU work alone (CPU: perf_counter)."""
    fn()
    if grid.DEVICE != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), True
    torch.cuda.synchronize()
    pairs, host = [], []
    for _ in range(repeats):
        torch.cuda._sleep(SPIN_CYCLES)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        host.append((time.perf_counter() - t0) * 1e3)
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs), max(host) < 0.8 * spin


def end_to_end(bufs, tuned: BatchNormTuning, rounds: int) -> list[dict]:
    """Default vs tuned, fwd and fwd+bwd, alternated (CUDA events, medians; host visible)."""
    module = BatchNormAct2d(bufs.x.shape[1]).to(grid.DEVICE)
    x, r = bufs.x.detach().requires_grad_(), bufs.r.detach().requires_grad_()
    rows = []
    for direction in ("fwd", "fwd+bwd"):

        def make(tuning, direction=direction):
            def run():
                with batch_norm_tuning(tuning):
                    y = module(x, r)
                    if direction == "fwd+bwd":
                        torch.autograd.grad(y, [x, r, module.weight, module.bias], bufs.dy)

            return run

        t = compare(
            {"default": make(DEFAULT), "tuned": make(tuned)},
            rounds=rounds,
            repeats_per_round=10,
            warmup=2,
            device=grid.DEVICE,
        )
        rows.append(
            dict(
                direction=direction,
                default_ms=t["default"].median_s * 1e3,
                tuned_ms=t["tuned"].median_s * 1e3,
            )
        )
    return rows
