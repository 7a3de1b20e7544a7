"""The guide's quantitative rules of thumb, each measured on this GPU and given a verdict.

A GPU design guide written for the A100 states them (its section numbers are each claim's
`where`); docs/design.md, "The design guide's claims", lists the main ones against what an H200
measured. Each function below runs one small measurement (both variants
checked to compute the same result first, then timed alternately) or reads the probe's sweeps,
and returns the gain of the guide's advice. The verdict rule is in `claim_check`; a claim with its
own rule says so. bf16, channels_last and cuDNN autotuning unless a claim says otherwise.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.nn.functional as F

from . import guide_claims_more  # noqa: F401  (registers the pooling, fusion and launch claims)
from .claim_check import (
    FAILS,
    HOLDS,
    NOT_MEASURED,
    PARTLY,
    REGISTRY,
    Claim,
    ClaimContext,
    Measured,
    ab_gain,
    ab_rounds,
    ab_times,
    check_same,
    claim,
    gain_of,
    ms,
    rounds_both_picks,
    run_claims,
    split_rounds,
)
from .cliffs import alignment_level, relative
from .measure import ConvShape, conv_operands, math_mode, per_call_s
from .plan import ProbePlan
from .profile import conv_curves, gemm_curves

__all__ = [
    "FAILS",
    "HOLDS",
    "NOT_MEASURED",
    "PARTLY",
    "REGISTRY",
    "ClaimContext",
    "run_claims",
    "selected",
]

# Report order: shapes first (as docs/design.md's table), then pooling, fusion and launches.
ORDER = (
    "conv-channels-63-vs-64",
    "dims-multiple-of-32",
    "tensor-core-multiple-of-8",
    "batch-127-vs-128",
    "batch-512-vs-256",
    "stem-7x7-pad-to-32",
    "spatial-multiple-of-32",
    "channels-last",
    "cudnn-benchmark",
    "pool-vs-mean",
    "einsum-vs-bmm",
    "qkv-fusion",
    "layernorm-gelu-fusion",
    "bn-relu-fusion",
    "launch-overhead",
    "memory-wall-1024-gemm",
)

BF16 = torch.bfloat16


def selected(plan: ProbePlan) -> list[Claim]:
    if not plan.claims:
        return []
    rank = {claim_id: i for i, claim_id in enumerate(ORDER)}
    return sorted(REGISTRY.values(), key=lambda c: rank.get(c.id, len(ORDER)))


def _stage1(ctx: ClaimContext) -> tuple[int, int]:
    """(channels, height = width) of a ResNet-50 stage-1 3x3 conv; toy sizes on the CPU test."""
    return ctx.pick((64, 56), tiny=(8, 4))


def _conv(shape: ConvShape, ctx: ClaimContext, *, seed_w: torch.Tensor | None = None):
    """(forward closure, x, w) of a bf16 convolution, padding kernel // 2."""
    x, w = conv_operands(shape, "bf16", ctx.device)
    w = w if seed_w is None else seed_w
    return (lambda: F.conv2d(x, w, stride=shape.stride, padding=shape.kernel // 2)), x, w


def _timed_convs(shapes: dict[str, ConvShape], ctx: ClaimContext, timer=ab_times) -> Any:
    """`timer` (`ab_times`, or `ab_gain` for a gain) over bf16 convolutions, cuDNN autotuned."""
    with math_mode("bf16", cudnn_benchmark=True):
        return timer({k: _conv(s, ctx)[0] for k, s in shapes.items()}, ctx)


def _conv_rounds_both_picks(shapes: dict[str, ConvShape], ctx: ClaimContext) -> Any:
    """`rounds_both_picks` over bf16 convolutions of these shapes."""
    return rounds_both_picks(lambda: {k: _conv(s, ctx)[0] for k, s in shapes.items()}, ctx)


# ---- convolution shapes and channels -----------------------------------------------------------
@claim(
    id="conv-channels-63-vs-64",
    where="§2.1",
    says="A 3x3 convolution with 63 input channels instead of 64 runs 35% slower "
    "(cuDNN falls back from implicit GEMM to FFT).",
    claimed="35% lower speed: 64 channels 1.54x as fast",
    claimed_gain=1 / 0.65 - 1,
)
def conv_63_vs_64(ctx: ClaimContext) -> Measured:
    batch, hw = ctx.pick(256, tiny=1), ctx.pick(56, tiny=4)
    cout = ctx.pick(128, tiny=8)
    shapes = {
        f"cin{c}": ConvShape(batch=batch, cin=c, cout=cout, hw=hw, kernel=3) for c in (63, 64)
    }
    gain, t, numbers = _timed_convs(shapes, ctx, timer=ab_gain)
    return Measured(
        gain=gain,
        numbers=numbers | {f"{k}_tflops": s.flops / t[k] / 1e12 for k, s in shapes.items()},
        how=f"3x3 conv, batch {batch}, {hw}x{hw}, 63 or 64 -> {cout} channels",
    )


def _pooled_levels(curves, lo: int, hi: int) -> float | None:
    """Relative throughput of the sizes whose alignment level lies in [lo, hi]: the median at
    each level, then the mean of the levels, so that each level weighs alike whatever sizes a
    sweep has (the quick probe has fewer odd sizes than the full one, and odd sizes are the
    slowest: pooled together, the two probes measured different things)."""
    by_level: dict[int, list[float]] = {}
    for c in curves:
        for s, r in relative(c):
            level = alignment_level(s)
            if lo <= level <= hi:
                by_level.setdefault(level, []).append(r)
    if not by_level:
        return None
    return statistics.fmean(statistics.median(v) for v in by_level.values())


def _align_curves(ctx: ClaimContext, dtypes=("bf16", "fp16")) -> tuple[str, list]:
    for dtype in dtypes:
        curves = [c for dim in ("K", "N") for c in gemm_curves(ctx.sweeps, dtype, "nn", dim)]
        if curves:
            return dtype, curves
    return "", []


@claim(
    id="dims-multiple-of-32",
    where="§2.1, §3.1",
    says="Batch, channels and other dims should be multiples of 32 (the warp size; 64 for "
    "batch on an A100), not merely of 8.",
    claimed="qualitative: multiples of 32 faster than multiples of 8",
)
def dims_multiple_of_32(ctx: ClaimContext) -> Measured:
    dtype, curves = _align_curves(ctx)
    convs = [c for name in ("3x3 cin", "3x3 cout") for c in conv_curves(ctx.sweeps, "bf16", name)]
    numbers: dict[str, Any] = {}
    gains = []
    for label, cs in (("gemm", curves), ("conv", convs)):
        x8, x32 = _pooled_levels(cs, 8, 16), _pooled_levels(cs, 32, 1 << 30)
        if x8 and x32:
            numbers.update({f"{label}_x8_x16_relative": x8, f"{label}_x32_plus_relative": x32})
            gains.append(x32 / x8 - 1)
    return Measured(
        gain=max(gains) if gains else None,
        numbers=numbers,
        how=f"probe sweeps: {dtype} GEMM K and N, bf16 3x3 conv channels; median "
        "throughput relative to full speed of sizes that are multiples of 8 or "
        "16 (not 32) against multiples of 32 or more; the larger gain counts",
    )


@claim(
    id="tensor-core-multiple-of-8",
    where="§2.1",
    says="With fp16, channels and batch must be multiples of 8 (or 16), otherwise tensor "
    "cores are not used.",
    claimed="falls to the CUDA-core rate: gain = tensor-core peak / CUDA-core peak",
)
def tensor_core_multiple_of_8(ctx: ClaimContext) -> Measured:
    dtype, curves = _align_curves(ctx, ("fp16", "bf16"))
    if not curves:
        return Measured(gain=None, numbers={}, how="needs the fp16 or bf16 GEMM sweep")
    aligned, missed = _pooled_levels(curves, 8, 1 << 30), _pooled_levels(curves, 1, 4)
    cuda_core_peak = ctx.spec.peak_flops(dtype, tensor_cores=False)
    claimed = ctx.spec.peak_flops(dtype) / cuda_core_peak - 1
    cliff = ctx.analysis.get("gemm", {}).get("nn", {}).get(dtype, {}).get("K", {})
    return Measured(
        gain=aligned / missed - 1 if missed else None,
        claimed_gain=claimed,
        numbers={
            "aligned_relative": aligned,
            "unaligned_relative": missed,
            "granularity_K": cliff.get("granularity"),
        },
        how=f"probe sweep: {dtype} GEMM K and N; sizes that are multiples of 8 "
        "against sizes that are not",
    )


@claim(
    id="batch-127-vs-128",
    where="§3.1",
    says="Going from batch 127 to 128 raises ResNet-50 throughput by 26% (1250 -> 1580 img/s "
    "on an A100): at 127 the last warp has 31 idle threads.",
    claimed="+26% throughput",
    claimed_gain=0.26,
)
def batch_127_vs_128(ctx: ClaimContext) -> Measured:
    (c, hw), nk = _stage1(ctx), ctx.pick(4096, tiny=64)
    shapes = {str(b): ConvShape(batch=b, cin=c, cout=c, hw=hw, kernel=3) for b in (127, 128)}
    tc, rc = _conv_rounds_both_picks(shapes, ctx)
    w = torch.randn(nk, nk, device=ctx.device, dtype=BF16)
    xs = {str(m): torch.randn(m, nk, device=ctx.device, dtype=BF16) for m in (127, 128)}
    tg, rg = ab_rounds({m: (lambda x=x: F.linear(x, w)) for m, x in xs.items()}, ctx)
    per_sample = {k: _per_sample_gain(t, 127, 128) for k, t in (("conv", tc), ("gemm", tg))}
    by_round = [
        max(_per_sample_gain(a, 127, 128), _per_sample_gain(b, 127, 128))
        for a, b in zip(rc, split_rounds(rg) * 2)  # the GEMM's rounds beside both conv picks
    ]
    return Measured(
        gain=max(per_sample.values()),
        numbers={
            "conv_b127_ms": ms(tc["127"]),
            "conv_b128_ms": ms(tc["128"]),
            "gemm_m127_ms": ms(tg["127"]),
            "gemm_m128_ms": ms(tg["128"]),
            "conv_gain": per_sample["conv"],
            "gemm_gain": per_sample["gemm"],
            "gain_spread": [round(min(by_round), 4), round(max(by_round), 4)],
        },
        how=f"samples/s at batch 127 and 128: a ResNet-50 stage-1 3x3 conv {c}->{c} at "
        f"{hw}x{hw} and a Linear {nk}->{nk} over M tokens (the larger gain "
        "counts; the full ResNet-50 is not run here)",
    )


def _per_sample_gain(seconds: dict[str, float], slow: int, fast: int) -> float:
    """How much faster per sample batch `fast` runs than batch `slow` (keys: the batches)."""
    return (fast / seconds[str(fast)]) / (slow / seconds[str(slow)]) - 1


@claim(
    id="batch-512-vs-256",
    where="§5.2 (pit four)",
    says="Doubling the batch from 256 to 512 lowers throughput (L2 misses rise from 35% to "
    "72%); an A100 peaks near batch 384.",
    claimed="qualitative: batch 256 faster per image than 512",
)
def batch_512_vs_256(ctx: ClaimContext) -> Measured:
    c, hw = _stage1(ctx)
    shapes = {str(b): ConvShape(batch=b, cin=c, cout=c, hw=hw, kernel=3) for b in (256, 512)}
    t, rounds = _conv_rounds_both_picks(shapes, ctx)
    gains = [_per_sample_gain(r, 512, 256) for r in rounds]
    numbers = {
        "b256_ms": ms(t["256"]),
        "b512_ms": ms(t["512"]),
        "gain_spread": [round(min(gains), 4), round(max(gains), 4)],
    }
    sweep = {
        r["size"]: r["flops_per_s"]
        for r in ctx.sweeps.get("conv_batch", [])
        if r.get("flops_per_s")
    }
    numbers.update({f"sweep_b{b}_tflops": sweep[b] / 1e12 for b in (256, 384, 512) if b in sweep})
    return Measured(
        gain=_per_sample_gain(t, 512, 256),
        numbers=numbers,
        how=f"samples/s of a 3x3 conv {c}->{c} at {hw}x{hw}, batch 256 against 512 (the "
        "spread over rounds autotuned and with cuDNN's heuristic pick)",
    )


@claim(
    id="stem-7x7-pad-to-32",
    where="§4.2",
    says="Padding the 7x7 stem convolution's input from 3 to 32 channels makes it 18% faster.",
    claimed="+18%",
    claimed_gain=0.18,
)
def stem_pad_to_32(ctx: ClaimContext) -> Measured:
    batch, hw = ctx.pick(128, tiny=2), ctx.pick(224, tiny=16)
    x3, w3 = conv_operands(
        ConvShape(batch=batch, cin=3, cout=64, hw=hw, kernel=7), "bf16", ctx.device
    )
    x32 = F.pad(x3, (0, 0, 0, 0, 0, 29)).contiguous(memory_format=torch.channels_last)
    w32 = F.pad(w3, (0, 0, 0, 0, 0, 29)).contiguous(memory_format=torch.channels_last)
    with math_mode("bf16", cudnn_benchmark=True):
        conv3 = lambda: F.conv2d(x3, w3, stride=2, padding=3)
        conv32 = lambda: F.conv2d(x32, w32, stride=2, padding=3)
        check_same("stem 3 vs 32 channels", conv32(), conv3())
        gain, t, numbers = ab_gain({"cin3": conv3, "cin32": conv32}, ctx)
        pad = lambda: F.pad(x3, (0, 0, 0, 0, 0, 29)).contiguous(memory_format=torch.channels_last)
        pad_s = per_call_s(pad, [()], ctx.cfg)
    return Measured(
        gain=gain,
        numbers=numbers
        | {"pad_ms": ms(pad_s), "gain_with_pad": gain_of(t["cin3"], t["cin32"] + pad_s)},
        how=f"7x7 stride-2 conv -> 64, batch {batch}, {hw}x{hw}, on 3 channels or on "
        "the same input zero-padded to 32 (padding not timed; gain_with_pad "
        "counts it)",
    )


@claim(
    id="spatial-multiple-of-32",
    where="§2.1",
    says="Feature-map height and width should be multiples of 32 so no warp idles.",
    claimed="qualitative: 64x64 faster per FLOP than 56x56",
)
def spatial_multiple_of_32(ctx: ClaimContext) -> Measured:
    batch, (c, _) = ctx.pick(128, tiny=2), _stage1(ctx)
    sizes = ctx.pick((56, 64), tiny=(6, 8))
    shapes = {str(s): ConvShape(batch=batch, cin=c, cout=c, hw=s, kernel=3) for s in sizes}
    t, rounds = _conv_rounds_both_picks(shapes, ctx)
    rate = {k: shapes[k].flops / t[k] for k in shapes}
    lo, hi = (str(s) for s in sizes)

    def gain(seconds: dict[str, float]) -> float:
        return (shapes[hi].flops / seconds[hi]) / (shapes[lo].flops / seconds[lo]) - 1

    gains = [gain(r) for r in rounds]
    return Measured(
        gain=rate[hi] / rate[lo] - 1,
        numbers={f"hw{k}_tflops": r / 1e12 for k, r in rate.items()}
        | {"gain_spread": [round(min(gains), 4), round(max(gains), 4)]},
        how=f"TFLOP/s of a 3x3 conv {c}->{c}, batch {batch}, at {lo}x{lo} against {hi}x{hi}",
    )


@claim(
    id="channels-last",
    where="docs/design.md (layout), guide §3.2 (memory access patterns)",
    says="Memory layout matters: convolutions should run channels_last, not NCHW.",
    claimed="qualitative: channels_last faster",
)
def channels_last(ctx: ClaimContext) -> Measured:
    batch, (c, hw) = ctx.pick(128, tiny=2), _stage1(ctx)
    x, w = conv_operands(
        ConvShape(batch=batch, cin=c, cout=c, hw=hw, kernel=3, channels_last=False),
        "bf16",
        ctx.device,
    )
    gy = torch.randn(batch, c, hw, hw, device=ctx.device, dtype=BF16)
    steps = {}
    for name, fmt in (("nchw", torch.contiguous_format), ("channels_last", torch.channels_last)):
        xf, wf, gyf = (t.contiguous(memory_format=fmt) for t in (x, w, gy))
        xf.requires_grad_(True)
        wf.requires_grad_(True)
        steps[name] = lambda xf=xf, wf=wf, gyf=gyf: torch.autograd.grad(
            F.conv2d(xf, wf, padding=1), (xf, wf), gyf
        )
    with torch.enable_grad(), math_mode("bf16", cudnn_benchmark=True):
        check_same(
            "NCHW vs channels_last input gradients", steps["channels_last"]()[0], steps["nchw"]()[0]
        )
        gain, _, numbers = ab_gain(steps, ctx)
    return Measured(
        gain=gain,
        numbers=numbers,
        how=f"forward + backward of a 3x3 conv {c}->{c}, batch {batch}, {hw}x{hw}",
    )


@claim(
    id="cudnn-benchmark",
    where="§3.2",
    says="Turn on torch.backends.cudnn.benchmark so cuDNN picks Winograd for 3x3 convolutions.",
    claimed="qualitative: autotuned faster",
)
def cudnn_benchmark(ctx: ClaimContext) -> Measured:
    batch, (c, hw) = ctx.pick(128, tiny=2), _stage1(ctx)
    run, _, _ = _conv(ConvShape(batch=batch, cin=c, cout=c, hw=hw, kernel=3), ctx)

    def with_flag(flag: bool):
        def call():
            torch.backends.cudnn.benchmark = flag
            return run()

        return call

    with math_mode("bf16"):
        gain, _, numbers = ab_gain(
            {"heuristic": with_flag(False), "autotuned": with_flag(True)}, ctx
        )
    return Measured(
        gain=gain,
        numbers=numbers,
        how=f"3x3 conv {c}->{c}, batch {batch}, {hw}x{hw}, cudnn.benchmark off and on",
    )
