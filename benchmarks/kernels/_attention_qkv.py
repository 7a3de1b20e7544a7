"""bench_attention.py's FusedQKV section (its correctness check, the gradients SDPA's backward
gives q, k, v, the timing rows and the profiler's kernel counts) and the timing helpers every
section of that script uses. Each function takes the device; all run in bf16 (DTYPE)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, beside this

import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare
from gpushape.kernels import FusedQKV

DTYPE = torch.bfloat16


def warm_up(fns, calls=2):
    """Compile, autotune and pick cuBLAS heuristics outside the timed rounds."""
    for fn in fns.values():
        for _ in range(calls):
            fn()


def without_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def cuda_kernels(fn, dev: str) -> Counter:
    """Kernel names launched by fn (aten ops when smoke-testing on the CPU)."""
    fn()
    sync(dev)
    activity = ProfilerActivity.CUDA if dev == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        fn()
        sync(dev)
    return Counter(
        e.name
        for e in prof.events()
        if e.device_type.name == dev.upper() and (dev == "cuda" or e.cpu_parent is None)
    )


def copy_like(kernels: Counter) -> int:
    """Kernels that only move data: torch's copies and cats, and FusedQKV's gradient assembly."""
    return sum(
        n
        for name, n in kernels.items()
        if "copy" in name.lower() or "CatArray" in name or "assemble" in name
    )


def three_linears(cfg, dev):
    d = cfg["E"] // cfg["H"]
    return [
        nn.Linear(cfg["E"], heads * d, bias=cfg["bias"]).to(dev, DTYPE)
        for heads in (cfg["H"], cfg["KV"], cfg["KV"])
    ]


def baseline_qkv(layers, head_dim):
    def run(x):
        b, t, _ = x.shape
        return tuple(layer(x).view(b, t, -1, head_dim).transpose(1, 2) for layer in layers)

    return run


def check_qkv(cfg, dev, numeric) -> str:
    """FusedQKV against three nn.Linear, both gated against the float64 Linears (`numeric`: the
    tests' _numeric.py)."""
    layers = three_linears(cfg, dev)
    fused = FusedQKV.from_linears(*layers, cfg["H"], cfg["KV"])
    ref = [
        nn.Linear(layer.in_features, layer.out_features, bias=cfg["bias"]).to(dev, torch.float64)
        for layer in layers
    ]
    for r, layer in zip(ref, layers):
        r.load_state_dict(layer.state_dict())
    x = torch.randn(2, cfg["T"] // 4, cfg["E"], device=dev, dtype=torch.float64)
    d = cfg["E"] // cfg["H"]
    outs = zip(fused(x.to(DTYPE)), baseline_qkv(layers, d)(x.to(DTYPE)), baseline_qkv(ref, d)(x))
    worst = [numeric.assert_gate(name, o, t, r) for name, (o, t, r) in zip("qkv", outs)]
    return "pass: " + ", ".join(f"{r.name} {r.err_ours:.1e} <= {r.bound:.1e}" for r in worst)


def qkv_grads(cfg, layout: str, dev: str) -> list[torch.Tensor]:
    """Random gradients of q, k, v (B, heads, T, D). "sdpa": laid out as the backward of
    scaled_dot_product_attention gives them on the H200, flash and memory-efficient alike
    ((B, T, heads, D) memory, transposed; benchmarks/kernels/probe_qkv_grads.py), which the
    three Linear layers reshape for free. "bhtd": contiguous (B, heads, T, D), for which they
    each pay a transposing copy."""
    d = cfg["E"] // cfg["H"]
    shapes = [(cfg["B"], h, cfg["T"], d) for h in (cfg["H"], cfg["KV"], cfg["KV"])]
    if layout == "bhtd":
        return [torch.randn(s, device=dev, dtype=DTYPE) for s in shapes]
    return [
        torch.randn(b, t, h, dd, device=dev, dtype=DTYPE).transpose(1, 2) for b, h, t, dd in shapes
    ]


# (row label, gradient layout, through SDPA, replayed from a CUDA graph); the first three rows
# are the criteria's: the projections' own forward+backward with gradients as SDPA gives them
QKV_DIRECTIONS = (
    ("fwd", None, False, False),
    ("fwd+bwd", "sdpa", False, False),
    ("fwd+bwd graph", "sdpa", False, True),
    ("fwd+bwd graph, (B,H,T,D) grads", "bhtd", False, True),
    ("fwd+bwd graph, with SDPA", None, True, True),
)


def time_qkv(label, cfg, rounds, repeats, dev) -> tuple[list[dict], dict]:
    layers = three_linears(cfg, dev)
    fused = FusedQKV.from_linears(*layers, cfg["H"], cfg["KV"])
    d = cfg["E"] // cfg["H"]
    x = torch.randn(cfg["B"], cfg["T"], cfg["E"], device=dev, dtype=DTYPE, requires_grad=True)
    variants = {
        "3 Linear": (
            baseline_qkv(layers, d),
            [x] + [p for layer in layers for p in layer.parameters()],
        ),
        "gpushape": (fused, [x, *fused.parameters()]),
    }
    gqa = dict(enable_gqa=True) if cfg["KV"] != cfg["H"] else {}
    causal = cfg.get("causal", False)
    grad_out = torch.randn(cfg["B"], cfg["H"], cfg["T"], d, device=dev, dtype=DTYPE)

    def step(f, wrt, layout, sdpa):
        if sdpa:  # the projections and the attention they feed, forward and backward
            return lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(*f(x), is_causal=causal, **gqa), wrt, grad_out
            )
        if layout is None:
            return lambda: without_grad(f, x)
        grads = qkv_grads(cfg, layout, dev)
        return lambda: torch.autograd.grad(f(x), wrt, grads)

    rows = []
    for direction, layout, sdpa, graph in QKV_DIRECTIONS:
        timed = {name: step(f, wrt, layout, sdpa) for name, (f, wrt) in variants.items()}
        if graph:  # GPU time alone: no host, allocator or launch cost
            timed = {name: common.graphed(fn, dev) for name, fn in timed.items()}
        warm_up(timed)
        for name, t in compare(timed, rounds=rounds, repeats_per_round=repeats, warmup=2).items():
            rows.append(
                dict(
                    case=label,
                    direction=direction,
                    variant=name,
                    config=cfg,
                    grad_layout=layout,
                    with_sdpa=sdpa,
                    median_ms=t.median_s * 1e3,
                    p10_ms=t.p10_s * 1e3,
                    p90_ms=t.p90_s * 1e3,
                    repeats=t.repeats,
                )
            )
    grads = qkv_grads(cfg, "sdpa", dev)
    counts = {}
    for name, (f, wrt) in variants.items():
        sdpa = lambda f=f: F.scaled_dot_product_attention(*f(x), is_causal=True, **gqa)
        fwd = cuda_kernels(lambda sdpa=sdpa: without_grad(sdpa), dev)
        outs = f(x)
        bwd = cuda_kernels(
            lambda outs=outs, wrt=wrt: torch.autograd.grad(outs, wrt, grads, retain_graph=True),
            dev,
        )
        counts[name] = dict(
            fwd_with_sdpa_kernels=sum(fwd.values()),
            fwd_copy_kernels=copy_like(fwd),
            bwd_kernels=sum(bwd.values()),
            bwd_copy_kernels=copy_like(bwd),
            fwd_names=dict(fwd),
            bwd_names=dict(bwd),
        )
    with torch.no_grad():  # the test's proof: GEMM alone + SDPA on contiguous q, k, v
        q, k, v = (t.contiguous() for t in fused(x))
        alone = cuda_kernels(lambda: F.linear(x, fused.weight, fused.bias), dev) + cuda_kernels(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa), dev
        )
    together = Counter(counts["gpushape"]["fwd_names"])  # as in the GPU test: counts, no copy
    counts["no_kernel_between_gemm_and_sdpa"] = (
        sum(together.values()) == sum(alone.values()) and copy_like(together) == 0
    )
    return rows, counts
