"""Benchmark the attention-path kernels on one GPU: softmax_dropout, FusedQKV, KVCache (bf16).

    python benchmarks/kernels/bench_attention.py [--quick] [--sections softmax,qkv,kv]

1. Correctness first, on the GPU: softmax_dropout against PyTorch's composition with the
   kernel's own dropout mask, FusedQKV against three nn.Linear (the numeric gate of TESTING.md),
   KVCache.append against torch.cat. 2. Copy bandwidth in the same run.
3. softmax + dropout (p 0.1): eager `F.dropout(F.softmax(x))`, torch.compile of it, gpushape at
   (262144, 1024) and scores (16, 16, T, T), T 1024, 2048 (+ scaled causal at T 1024). Forward
   under no_grad; forward+backward = `fn(x).backward(gy)` with x.grad accumulating, and memory
   held for backward = peak allocated during the forward minus before (input excluded), both
   exactly as the baselines in benchmarks/results/baselines-h200/. GB/s from minimum bytes:
   forward 2 S (read x, write y), forward+backward 5 S (+ read x, dy, write dx), S = bytes of x.
4. FusedQKV against three Linear + view/transpose at BERT-base (E 768, 12 heads, T 512, B 32,
   bias) and LLaMA-7B (E 4096, 32 heads, T 2048, B 1, causal): forward (no_grad),
   forward+backward (autograd.grad w.r.t. x and all parameters; random grads of q, k, v laid
   out as SDPA's backward gives them, see `qkv_grads`); torch.profiler kernel counts of the
   forward through scaled_dot_product_attention, and of the backward. The forward+backward is
   also replayed from a CUDA graph ("fwd+bwd graph"): GPU time alone, without the host's
   launch, autograd and allocator cost that the eager timing includes. Two more graph rows:
   gradients contiguous in (B, heads, T, D), as a written-out attention gives them, and the
   projections with scaled_dot_product_attention after them.
5. Appending one step (B 4, 32 heads, D 128) at cache lengths 128 .. 32768: KVCache.append,
   append_static (eager and replayed from a CUDA graph), torch.cat of the whole cache.
Timings: CUDA events, variants alternated round by round (gpushape.bench.compare), medians.
Writes $OUT/bench_attention.json and .png (OUT defaults to ./out); prints a table last.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.bench import compare, write_results  # noqa: E402
from gpushape.kernels import KVCache, softmax_dropout  # noqa: E402
from gpushape.kernels.attention.softmax_dropout import draw_seed, dropout_keep_mask  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helpers, beside this
import _bench_common as common  # noqa: E402
from _attention_qkv import DTYPE, check_qkv, sync, time_qkv, warm_up, without_grad  # noqa: E402
from attention_report import criteria, plot, print_table  # noqa: E402

P = 0.1  # dropout probability; every section in bf16 (DTYPE)
DEV = "cuda"  # --device cpu (TRITON_INTERPRET=1, tiny sizes) only smoke-tests this script
SOFTMAX_SHAPES = {
    "262144x1024": (262144, 1024),
    "scores T=1024": (16, 16, 1024, 1024),
    "scores T=2048": (16, 16, 2048, 2048),
}
QKV_SHAPES = {
    "BERT-base": dict(E=768, H=12, KV=12, T=512, B=32, bias=True, causal=False),
    "LLaMA-7B": dict(E=4096, H=32, KV=32, T=2048, B=1, bias=False, causal=True),
}
KV_LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]


NUMERIC = common.load_numeric()


def torch_softmax_dropout(x):
    return F.dropout(F.softmax(x, dim=-1), p=P, training=True)


def check_softmax(shape, **kw) -> str:
    torch.manual_seed(1)
    seed = draw_seed(DEV)
    keep = dropout_keep_mask(seed, shape, P, DEV).double() / (1 - P)

    def ours(x):
        torch.manual_seed(1)
        return softmax_dropout(x, P, **kw)

    def composition(x):
        z = x * kw.get("scale", 1.0)
        if kw.get("is_causal"):
            z = z.masked_fill(
                ~torch.ones(shape[-2:], dtype=torch.bool, device=DEV).tril(), float("-inf")
            )
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        return (F.softmax(z, dim=-1).to(acc) * keep.to(acc)).to(x.dtype)

    x = torch.randn(shape, device=DEV, dtype=DTYPE, requires_grad=True)
    results = NUMERIC.gate_forward_backward(ours, composition, (x,), names=("x",))
    return "pass: " + ", ".join(f"{r.name} {r.err_ours:.1e} <= {r.bound:.1e}" for r in results)


def check_kv() -> str:
    cache = KVCache(2, 4, 64, 32, DTYPE, DEV)
    k_all = torch.empty(2, 4, 0, 32, device=DEV, dtype=DTYPE)
    for t in (7, 1, 1, 5):
        k = torch.randn(2, 4, t, 32, device=DEV, dtype=DTYPE)
        k_all = torch.cat([k_all, k], dim=2)
        assert torch.equal(cache.append(k, k)[0], k_all), "KVCache.append != torch.cat"
    return "pass: append == torch.cat over 4 appends"


def held_for_backward_mb(fn, x) -> float | None:
    if DEV != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = fn(x)
    held = torch.cuda.max_memory_allocated() - base
    del y
    return held / 2**20


def time_softmax(label, shape, rounds, repeats, **kw) -> list[dict]:
    x = torch.randn(shape, device=DEV, dtype=DTYPE, requires_grad=True)
    gy = torch.randn(shape, device=DEV, dtype=DTYPE)
    torch._dynamo.reset()
    eager = torch_softmax_dropout
    if kw:  # scaled, causal: PyTorch adds a -inf bias (built once, outside the timing)
        bias = causal_bias(shape)
        eager = lambda x: F.dropout(F.softmax(x * kw["scale"] + bias, dim=-1), p=P)
    fns = {
        "eager": eager,
        "compile": torch.compile(eager),
        "gpushape": lambda x: softmax_dropout(x, P, **kw),
    }
    size_bytes = x.numel() * x.element_size()
    rows = []
    for direction, passes in (("fwd", 2), ("fwd+bwd", 5)):

        def make(fn, direction=direction):
            if direction == "fwd":
                return lambda: without_grad(fn, x)
            return lambda: fn(x).backward(gy)

        timed = {name: make(fn) for name, fn in fns.items()}
        warm_up(timed)
        for name, t in compare(timed, rounds=rounds, repeats_per_round=repeats, warmup=2).items():
            rows.append(
                dict(
                    case=label,
                    shape=list(shape),
                    direction=direction,
                    variant=name,
                    median_ms=t.median_s * 1e3,
                    p10_ms=t.p10_s * 1e3,
                    p90_ms=t.p90_s * 1e3,
                    repeats=t.repeats,
                    gbps=passes * size_bytes / t.median_s / 1e9,
                )
            )
        x.grad = None
    for name, fn in fns.items():
        rows.append(
            dict(
                case=label,
                shape=list(shape),
                direction="memory",
                variant=name,
                held_mb=held_for_backward_mb(fn, x),
            )
        )
    return rows


def causal_bias(shape):
    t_q, t_k = shape[-2:]
    allowed = torch.ones(t_q, t_k, dtype=torch.bool, device=DEV).tril()
    return torch.zeros(t_q, t_k, device=DEV, dtype=DTYPE).masked_fill(~allowed, float("-inf"))


def time_kv(lengths, rounds, repeats) -> list[dict]:
    b, h, d = 4, 32, 128
    cache = KVCache(b, h, max(lengths), d, DTYPE, DEV)
    k, v = (torch.randn(b, h, 1, d, device=DEV, dtype=DTYPE) for _ in range(2))
    rows = []
    for length in lengths:
        past = torch.randn(b, h, length - 1, d, device=DEV, dtype=DTYPE)

        def eager(length=length):
            cache.length = length - 1
            cache.append(k, v)

        def static(length=length):
            cache.position.fill_(length - 1)
            cache.append_static(k, v)

        fns = {
            "append": eager,
            "append_static": static,
            "torch.cat": lambda past=past: (torch.cat([past, k], 2), torch.cat([past, v], 2)),
        }
        if DEV == "cuda":  # the static step replayed from a CUDA graph
            static()
            sync(DEV)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static()
            fns["append_static graph"] = graph.replay
        for name, t in compare(fns, rounds=rounds, repeats_per_round=repeats, warmup=3).items():
            rows.append(
                dict(
                    length=length,
                    variant=name,
                    median_us=t.median_s * 1e6,
                    p10_us=t.p10_s * 1e6,
                    p90_us=t.p90_s * 1e6,
                    repeats=t.repeats,
                )
            )
        del past, fns
        torch.cuda.empty_cache()
    cache.reset()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes")
    parser.add_argument("--sections", default="softmax,qkv,kv")
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: smoke-test the script (TRITON_INTERPRET=1, tiny sizes)",
    )
    args = parser.parse_args(argv)
    global DEV, SOFTMAX_SHAPES, QKV_SHAPES, KV_LENGTHS
    DEV = args.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("bench_attention: needs a CUDA GPU (or --device cpu to smoke-test)", file=sys.stderr)
        return 2
    if DEV == "cpu":
        SOFTMAX_SHAPES = {"64x128": (64, 128), "scores T=32": (2, 2, 32, 32)}
        QKV_SHAPES = {
            "tiny": dict(E=64, H=4, KV=4, T=16, B=2, bias=True),
            "tiny GQA": dict(E=64, H=4, KV=2, T=16, B=2, bias=False),
        }
        KV_LENGTHS = [8, 16, 32]
    torch.backends.cuda.matmul.allow_tf32 = True
    sections = set(args.sections.split(","))
    rounds, repeats = (3, 5) if args.quick else (5, 10)
    out_dir = Path(os.environ.get("OUT", "out"))
    torch.manual_seed(0)
    plain, causal = (
        ((64, 128), (2, 2, 16, 16)) if DEV == "cpu" else ((4096, 1024), (2, 4, 256, 256))
    )
    checks = {
        f"softmax_dropout {plain}": check_softmax(plain),
        f"softmax_dropout causal {causal}": check_softmax(causal, scale=0.125, is_causal=True),
        **{f"FusedQKV {k}": check_qkv(c, DEV, NUMERIC) for k, c in QKV_SHAPES.items()},
        "KVCache": check_kv(),
    }
    for name, verdict in checks.items():
        print(f"check {name}: {verdict}", flush=True)
    copy_gbps = common.measure_copy_gbps(DEV)
    sm, qkv, counts, kv = [], [], {}, []
    if "softmax" in sections:
        shapes = dict(SOFTMAX_SHAPES)
        if args.quick:
            shapes.pop("scores T=2048", None)
        for label, shape in shapes.items():
            sm += time_softmax(label, shape, rounds, repeats)
            print(f"timed softmax_dropout {label}", flush=True)
            torch.cuda.empty_cache()
        if not args.quick:
            causal_shape = list(SOFTMAX_SHAPES.values())[1]
            sm += time_softmax(
                f"causal T={causal_shape[-1]}",
                causal_shape,
                rounds,
                repeats,
                scale=0.125,
                is_causal=True,
            )
    if "qkv" in sections:
        for label, cfg in QKV_SHAPES.items():
            # GEMM-bound and host-sensitive: twice the rounds of the other sections
            rows, counts[label] = time_qkv(label, cfg, 2 * rounds, repeats, DEV)
            qkv += rows
            print(f"timed FusedQKV {label}", flush=True)
    if "kv" in sections:
        kv = time_kv(KV_LENGTHS[::2] if args.quick else KV_LENGTHS, rounds, repeats)
    verdicts = criteria(sm, qkv, counts, kv)
    path = write_results(
        out_dir / "bench_attention.json",
        dict(softmax_dropout=sm, fused_qkv=qkv, kernel_counts=counts, kv_append=kv),
        copy_bandwidth_gbps=copy_gbps,
        dtype="bf16",
        dropout_p=P,
        checks=checks,
        criteria=verdicts,
        timing=f"CUDA events, {rounds} alternating rounds x {repeats}, median",
    )
    plot(sm, qkv, kv, out_dir / "bench_attention.png")
    print(f"wrote {path}")
    print_table(sm, qkv, counts, kv, verdicts, copy_gbps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
