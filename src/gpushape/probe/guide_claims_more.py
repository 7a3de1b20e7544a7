"""The guide's claims about pooling, einsum, fusion, launches and the memory wall (see
`guide_claims` for the shape claims and the module that runs them all)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .claim_check import (
    FAILS,
    HOLDS,
    PARTLY,
    ClaimContext,
    Measured,
    ab_gain,
    check_same,
    claim,
    gain_of,
    ms,
)
from .measure import math_mode, per_call_s

BF16 = torch.bfloat16


class _OpNames(TorchDispatchMode):
    """Records the aten ops a call dispatches to: how PyTorch lowers it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def lowered_ops(fn) -> list[str]:
    """The distinct aten ops `fn()` runs, in order of first use."""
    with _OpNames() as names:
        fn()
    return list(dict.fromkeys(names.ops))


@claim(
    id="pool-vs-mean",
    where="§2.2",
    says="nn.AdaptiveAvgPool2d((1, 1)) runs a global reduce with every SM synchronising; "
    "torch.mean(x, dim=[2, 3]) has 40% lower latency.",
    claimed="40% lower latency: mean 1.67x as fast",
    claimed_gain=1 / 0.6 - 1,
)
def pool_vs_mean(ctx: ClaimContext) -> Measured:
    batch, channels = ctx.pick(256, tiny=2), ctx.pick(2048, tiny=8)
    x = torch.randn(batch, channels, 7, 7, device=ctx.device, dtype=BF16)
    pool = lambda: F.adaptive_avg_pool2d(x, 1)
    mean = lambda: x.mean(dim=(2, 3), keepdim=True)
    check_same("adaptive_avg_pool2d vs mean", pool(), mean())
    gain, _, numbers = ab_gain({"pool": pool, "mean": mean}, ctx)
    return Measured(
        gain=gain,
        numbers=numbers | {"pool_lowers_to": ", ".join(lowered_ops(pool))},
        how=f"AdaptiveAvgPool2d(1) against mean over H, W of a ({batch}, {channels}, "
        "7, 7) tensor, and the aten ops the pool dispatches to",
    )


@claim(
    id="einsum-vs-bmm",
    where="§2.3",
    says="torch.einsum('b h i d, h d j -> b h i j') runs a generic kernel; rewritten as "
    "torch.bmm it hits cuBLAS's optimised batched GEMM.",
    claimed="qualitative: bmm faster",
)
def einsum_vs_bmm(ctx: ClaimContext) -> Measured:
    b, h, i, d = ctx.pick((8, 16, 1024, 64), tiny=(1, 2, 8, 4))
    q = torch.randn(b, h, i, d, device=ctx.device, dtype=BF16)  # (B, H, I, D)
    k = torch.randn(h, d, i, device=ctx.device, dtype=BF16)  # (H, D, J)
    einsum = lambda: torch.einsum("bhid,hdj->bhij", q, k)

    def bmm() -> torch.Tensor:
        heads_first = q.transpose(0, 1).reshape(h, b * i, d)  # (H, B*I, D)
        return torch.bmm(heads_first, k).reshape(h, b, i, i).transpose(0, 1)  # (B, H, I, J)

    check_same("einsum vs bmm", einsum(), bmm())
    gain, _, numbers = ab_gain({"einsum": einsum, "bmm": bmm}, ctx)
    return Measured(
        gain=gain,
        numbers=numbers | {"einsum_lowers_to": ", ".join(lowered_ops(einsum))},
        how=f"q ({b}, {h}, {i}, {d}) times k ({h}, {d}, {i}) by einsum and by an "
        "explicit reshape + bmm, and the aten ops einsum dispatches to",
    )


@claim(
    id="qkv-fusion",
    where="§2.3",
    says="Three Q, K, V projections of one input should be one fused GEMM.",
    claimed="qualitative: one GEMM faster than three",
)
def qkv_fusion(ctx: ClaimContext) -> Measured:
    tokens, width = ctx.pick((16384, 768), tiny=(16, 8))
    x = torch.randn(tokens, width, device=ctx.device, dtype=BF16)
    ws = [torch.randn(width, width, device=ctx.device, dtype=BF16) / width**0.5 for _ in range(3)]
    w_qkv = torch.cat(ws)  # (3 * width, width)
    separate = lambda: [F.linear(x, w) for w in ws]
    fused = lambda: F.linear(x, w_qkv).split(width, dim=-1)
    check_same("three projections vs one", torch.cat(fused(), -1), torch.cat(separate(), -1))
    gain, _, numbers = ab_gain({"three_linear": separate, "one_linear": fused}, ctx)
    return Measured(
        gain=gain,
        numbers=numbers,
        how=f"{tokens} tokens of width {width}: three Linear {width}->{width} against "
        f"one Linear {width}->{3 * width}",
    )


def _room(ctx: ClaimContext, seconds: float, bytes_once: int) -> tuple[float | None, dict]:
    """Gain a kernel reading its input and writing its output once, at copy bandwidth, would
    have over `seconds`: the most any fusion can win."""
    copy = ctx.ceilings.get("copy_bytes_per_s")
    numbers = {"eager_ms": ms(seconds), "eager_gbps": bytes_once / seconds / 1e9}
    if not copy:
        return None, numbers
    bound_s = bytes_once / copy
    numbers.update({"copy_gbps": copy / 1e9, "one_pass_ms": ms(bound_s)})
    return seconds / bound_s - 1, numbers


@claim(
    id="layernorm-gelu-fusion",
    where="§3.3",
    says="A fused LayerNorm+GELU kernel is 2.1x as fast as PyTorch's LayerNorm then GELU.",
    claimed="2.1x as fast",
    claimed_gain=1.1,
)
def layernorm_gelu(ctx: ClaimContext) -> Measured:
    # the full size in the quick probe too: a smaller tensor would sit in L2 and flatter eager
    rows, width = ctx.pick((32768, 4096), tiny=(64, 32))
    x = torch.randn(rows, width, device=ctx.device, dtype=BF16)
    w, b = (torch.randn(width, device=ctx.device, dtype=BF16) for _ in range(2))
    seconds = per_call_s(lambda: F.gelu(F.layer_norm(x, (width,), w, b)), [()], ctx.cfg)
    gain, numbers = _room(ctx, seconds, 2 * x.numel() * x.element_size())  # read x, write y
    return Measured(
        gain=gain,
        numbers=numbers,
        how=f"eager LayerNorm + GELU forward on ({rows}, {width}) against one pass "
        "(read x, write y) at the measured copy bandwidth: the gain is the most "
        "a fused kernel could reach (an upper bound)",
    )


@claim(
    id="bn-relu-fusion",
    where="§2.2",
    says="BatchNorm followed by ReLU runs as two kernels, two reads and two writes; fused, "
    "one of each.",
    claimed="two passes over memory instead of one: 2x",
    claimed_gain=1.0,
)
def bn_relu(ctx: ClaimContext) -> Measured:
    batch, c, hw = ctx.pick((64, 256, 56), tiny=(2, 8, 4))
    x = torch.randn(batch, c, hw, hw, device=ctx.device, dtype=BF16)
    x = x.contiguous(memory_format=torch.channels_last)
    mean, var, w, b = (torch.rand(c, device=ctx.device, dtype=BF16) + 0.5 for _ in range(4))
    step = lambda: F.relu(F.batch_norm(x, mean, var, w, b, training=False))
    with math_mode("bf16", cudnn_benchmark=True):
        seconds = per_call_s(step, [()], ctx.cfg)
    gain, numbers = _room(ctx, seconds, 2 * x.numel() * x.element_size())
    return Measured(
        gain=gain,
        numbers=numbers,
        how=f"eager BatchNorm (eval) + ReLU on ({batch}, {c}, {hw}, {hw}) "
        "channels_last against one pass at the measured copy bandwidth (an "
        "upper bound on the fusion gain)",
    )


@claim(
    id="launch-overhead",
    where="§5.3, docs/design.md",
    says="Kernel launches cost real time: fewer, larger kernels (fusion, CUDA graphs) win.",
    claimed="qualitative: a launch from a CUDA graph costs much less than an eager one",
)
def launch_overhead(ctx: ClaimContext) -> Measured:
    eager = ctx.ceilings.get("launch_overhead_s")
    graph = ctx.ceilings.get("graph_launch_overhead_s")
    numbers = {
        "eager_us": None if eager is None else eager * 1e6,
        "graph_us": None if graph is None else graph * 1e6,
    }
    return Measured(
        gain=gain_of(eager, graph) if eager and graph else None,
        numbers=numbers,
        how="1000 one-element adds launched eagerly against replayed from a CUDA "
        "graph (the probe's launch ceilings)",
    )


MEMORY_WALL_RULE = (
    "the guide's point is that this GEMM waits on memory (it computes 0.3% of the "
    "time it loads): holds if computing at the measured fp16 GEMM peak takes "
    "under half the time of moving its bytes at copy bandwidth, partly if under "
    "the whole time, does not hold otherwise"
)


@claim(
    id="memory-wall-1024-gemm",
    where="§2.2",
    says="A 1024x1024 fp16 GEMM needs 2 us to load its 4 MB but only 6.9 ns to compute: the "
    "GPU spends its time waiting for data.",
    claimed="compute takes 0.3% of the load time (memory-bound)",
)
def memory_wall(ctx: ClaimContext) -> Measured:
    n = ctx.pick(1024, tiny=64)
    a, b = (torch.randn(n, n, device=ctx.device, dtype=torch.float16) for _ in range(2))
    with math_mode("fp16"):
        seconds = per_call_s(torch.matmul, [(a, b)], ctx.cfg)
    flops, bytes_moved = 2 * n**3, 3 * n * n * 2  # read A and B, write C
    peak = ctx.analysis.get("gemm_peak", {}).get("fp16") or ctx.spec.attainable_flops("fp16")
    copy = ctx.ceilings.get("copy_bytes_per_s") or ctx.spec.attainable_bandwidth_bytes_per_s()
    compute_s, memory_s = flops / peak, bytes_moved / copy
    ratio = compute_s / memory_s
    verdict = HOLDS if ratio < 0.5 else PARTLY if ratio < 1 else FAILS
    return Measured(
        gain=None,
        verdict=verdict,
        rule=MEMORY_WALL_RULE,
        numbers={
            "gemm_us": seconds * 1e6,
            "gemm_tflops": flops / seconds / 1e12,
            "compute_at_peak_us": compute_s * 1e6,
            "memory_at_copy_bw_us": memory_s * 1e6,
            "compute_over_memory": ratio,
            "guide_compute_over_memory": 0.003,
            "note": "the guide's 6.9 ns is 2.15e9 / 312e12 s = 6.9 us",
        },
        how=f"an fp16 {n}^3 GEMM timed; compute time at the measured fp16 peak "
        "against moving A, B and C once at the measured copy bandwidth",
    )
