"""Benchmark global response normalization (ConvNeXt-V2's GRN) on one GPU.

    python benchmarks/kernels/bench_grn.py [--quick] [--shapes 64x56x56x384:nhwc,...]
                                           [--variants eager,compile,gpushape]
                                           [--out results/bench_grn.json]

Shapes are N x H x W x C whatever the layout: nhwc (timm's channels_last=True, an (N, H, W, C)
tensor: ConvNeXt-V2's MLP, the default), nchw (an (N, C, H, W) tensor, contiguous) or nchw-cl
(the same in channels_last memory). The defaults: ConvNeXt-V2-Tiny's four GRNs at batch 64.

1. Checks gpushape against timm's composition on the GPU first, at every shape cut to batch 8:
   the numeric gate of TESTING.md on y and the gradients of x, weight and bias.
2. Measures device copy bandwidth in the same run (gpushape.bench.copy_bandwidth_bytes_per_s).
3. Times, bf16 (x, weight and bias), every variant
     eager    timm.layers.GlobalResponseNorm's forward (timm's formula written out when timm
              is not importable)
     compile  torch.compile of that forward (default mode, dynamic=False)
     gpushape gpushape.kernels.global_response_norm
   in two directions, each replayed from a CUDA graph (GPU time alone: no host cost):
     fwd      the forward with autograd recording (x, weight and bias require grad)
     fwd+bwd  forward, then torch.autograd.grad(y, (x, weight, bias), dy)
   alternating the variants round by round (gpushape.bench.compare: CUDA events, medians).
4. Writes the rows with bench.write_results (GPU, versions, date, command) to --out (default
   $OUT/bench_grn.json, OUT defaulting to ./out) and prints a table last.

GB/s counts minimum bytes (S: the bytes of x): fwd 2 S (read x, write y), fwd+bwd 5 S (and read
dy and x, write dx). gpushape's kernels move 3 S and 8 S (they read x twice a direction, and dy
twice): `kernel_bytes` and `kernel_gbps` in the rows. --device cpu (TRITON_INTERPRET=1, tiny
--shapes) smoke-tests the script: no CUDA graphs, perf_counter timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, beside this script

import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, write_results
from gpushape.kernels import global_response_norm

EPS = 1e-6
DTYPE = torch.bfloat16
SHAPES = [  # ((N, H, W, C), layout): ConvNeXt-V2-Tiny's GRNs (4 x dim channels) at batch 64
    ((64, 56, 56, 384), "nhwc"),
    ((64, 28, 28, 768), "nhwc"),
    ((64, 14, 14, 1536), "nhwc"),
    ((64, 7, 7, 3072), "nhwc"),
]
# layout -> (timm's channels_last flag, memory format of the 4-D tensor)
LAYOUTS = {
    "nhwc": (True, torch.contiguous_format),
    "nchw": (False, torch.contiguous_format),
    "nchw-cl": (False, torch.channels_last),
}
VARIANTS = ("eager", "compile", "gpushape")
DIRECTIONS = ("fwd", "fwd+bwd")
MIN_FACTOR = {"fwd": 2, "fwd+bwd": 5}  # minimum traffic in units of S, the bytes of x
KERNEL_FACTOR = {"fwd": 3, "fwd+bwd": 8}  # what gpushape's kernels move
CHECK_GATE_BATCH = 8  # the gate's float64 copies at batch 64 would take 1.2 GB a tensor


# ---- bytes ---------------------------------------------------------------------------------
def x_bytes(shape, dtype: torch.dtype = DTYPE) -> int:
    n, h, w, c = shape
    return n * h * w * c * torch.empty((), dtype=dtype).element_size()


def min_bytes(shape, dtype: torch.dtype = DTYPE) -> dict[str, int]:
    """Minimum bytes per direction: fwd reads x and writes y; the backward adds reading dy and
    x and writing dx."""
    s = x_bytes(shape, dtype)
    return {d: k * s for d, k in MIN_FACTOR.items()}


def kernel_bytes(shape, dtype: torch.dtype = DTYPE) -> dict[str, int]:
    """What gpushape's kernels move (`kernels/grn/_launch.py`): 3 S forward, 5 S backward."""
    s = x_bytes(shape, dtype)
    return {d: k * s for d, k in KERNEL_FACTOR.items()}


# ---- inputs, checks, variants ----------------------------------------------------------------
def torch_grn(x, weight, bias, eps=EPS, channels_last=True):
    """timm's GlobalResponseNorm.forward on plain tensors (as tests/kernel_ops/_grn_cases.py)."""
    dims, cdim, shape = ((1, 2), -1, (1, 1, 1, -1)) if channels_last else ((2, 3), 1, (1, -1, 1, 1))
    x_g = x.norm(p=2, dim=dims, keepdim=True)
    x_n = x_g / (x_g.mean(dim=cdim, keepdim=True) + eps)
    return x + torch.addcmul(bias.view(shape), weight.view(shape), x * x_n)


def make_inputs(shape, layout: str, device: str, batch: int | None = None):
    """x (requiring grad), weight and bias (parameters) and dy, bf16, x and dy in the layout;
    weight and bias random (timm's zeros would make y = x)."""
    channels_last, fmt = LAYOUTS[layout]
    n, h, w, c = shape
    n = n if batch is None else min(n, batch)
    full = (n, h, w, c) if channels_last else (n, c, h, w)
    x = (0.7 * torch.randn(full, device=device) - 0.3).to(DTYPE).contiguous(memory_format=fmt)
    dy = torch.randn(full, device=device).to(DTYPE).contiguous(memory_format=fmt)
    weight = torch.nn.Parameter(torch.randn(c, device=device).to(DTYPE))
    bias = torch.nn.Parameter(torch.randn(c, device=device).to(DTYPE))
    return x.requires_grad_(), weight, bias, dy


def eager_grn(channels_last: bool, weight, bias):
    """(fn(x), source): timm's module forward over these very parameters, else torch_grn."""
    try:
        import timm
        from timm.layers import GlobalResponseNorm
    except ImportError:
        return lambda x: torch_grn(x, weight, bias, EPS, channels_last), "timm's formula"
    module = GlobalResponseNorm(weight.numel(), eps=EPS, channels_last=channels_last)
    module.weight, module.bias = weight, bias  # the very parameters the other variants take
    return module, f"timm {timm.__version__} layers.GlobalResponseNorm"


def check(shape, layout: str, device: str) -> str:
    """The numeric gate on y and every gradient, at batch CHECK_GATE_BATCH."""
    channels_last = LAYOUTS[layout][0]
    x, w, b, _ = make_inputs(shape, layout, device, batch=CHECK_GATE_BATCH)
    results = common.load_gate()(
        lambda x, w, b: global_response_norm(x, w, b, EPS, channels_last),
        lambda x, w, b: torch_grn(x, w, b, EPS, channels_last),
        (x, w, b),
        names=("x", "weight", "bias"),
    )
    worst = max(results, key=lambda g: g.err_ours / max(g.bound, 1e-30))
    return f"pass (gate tightest {worst.name}: {worst.err_ours:.2e} <= {worst.bound:.2e})"


def variants(names, channels_last: bool, weight, bias) -> tuple[dict, str]:
    torch._dynamo.reset()  # a fresh static compile per shape
    eager, source = eager_grn(channels_last, weight, bias)
    fns = {
        "eager": eager,
        "compile": torch.compile(eager, dynamic=False) if "compile" in names else None,
        "gpushape": lambda x: global_response_norm(x, weight, bias, EPS, channels_last),
    }
    return {name: fns[name] for name in names}, source


# ---- timing --------------------------------------------------------------------------------
def time_shape(shape, layout: str, names, rounds: int, repeats: int, device: str):
    """(rows, the eager variant's source)."""
    x, w, b, dy = make_inputs(shape, layout, device)
    fns, source = variants(names, LAYOUTS[layout][0], w, b)
    makers = {
        "fwd": lambda fn: lambda: fn(x),
        "fwd+bwd": lambda fn: lambda: torch.autograd.grad(fn(x), (x, w, b), dy),
    }
    least, kernel = min_bytes(shape), kernel_bytes(shape)
    rows = []
    for direction, make in makers.items():
        runs = {name: common.graphed(make(fn), device) for name, fn in fns.items()}
        runs = {name: run for name, run in runs.items() if run is not None}
        timings = compare(runs, rounds=rounds, repeats_per_round=repeats, warmup=2, device=device)
        for name, t in timings.items():
            rows.append(
                dict(
                    shape=list(shape),
                    layout=layout,
                    direction=direction,
                    variant=name,
                    kernel_bytes=kernel[direction],
                    kernel_gbps=kernel[direction] / t.median_s / 1e9,
                    **common.timing_figures(t, least[direction]),
                )
            )
    return rows, source


def add_ratios(rows: list[dict], copy_gbps: float) -> None:
    """pct_copy (of this run's copy rate, minimum bytes) and speedup_vs_* of every row."""
    by_key = {(tuple(r["shape"]), r["layout"], r["direction"], r["variant"]): r for r in rows}
    for r in rows:
        r["pct_copy"] = r["gbps"] / copy_gbps
        for other in VARIANTS:
            base = by_key.get((tuple(r["shape"]), r["layout"], r["direction"], other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def format_table(rows: list[dict]) -> str:
    """One line a (shape, layout, direction, variant): median ms, GB/s of minimum bytes, % of
    the copy rate, gpushape's GB/s of its own traffic, speed-up over eager."""
    lines = [
        "median ms from CUDA-graph replays (CUDA events); GB/s: minimum bytes (fwd 2S, fwd+bwd "
        "5S); %copy: of this run's copy rate; kern: gpushape's own traffic (3S, 8S)",
        f"{'shape':>16s} {'layout':7s} {'dir':8s}{'variant':>9s}{'ms':>9s}{'GB/s':>7s}"
        f"{'%copy':>7s}{'kern':>7s}{'x eager':>9s}",
    ]
    for r in rows:
        kern = f"{r['kernel_gbps']:7.0f}" if r["variant"] == "gpushape" else f"{'':>7s}"
        ratio = r.get("speedup_vs_eager", 1.0 if r["variant"] == "eager" else float("nan"))
        name = "x".join(map(str, r["shape"]))
        lines.append(
            f"{name:>16s} {r['layout']:7s} {r['direction']:8s}{r['variant']:>9s}"
            f"{r['median_ms']:9.3f}{r['gbps']:7.0f}{100 * r['pct_copy']:6.0f}%{kern}"
            f"{ratio:9.2f}"
        )
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[tuple[int, ...], str]]:
    """ "64x56x56x384:nhwc,8x28x28x768:nchw" -> [((64, 56, 56, 384), "nhwc"), ...]: N x H x W
    x C whatever the layout."""
    out = []
    for item in text.split(","):
        dims, _, layout = item.partition(":")
        layout = layout or "nhwc"
        if layout not in LAYOUTS:
            raise SystemExit(f"bench_grn: layout {layout!r} unknown; known: {', '.join(LAYOUTS)}")
        shape = common.parse_shapes(dims)[0]
        if len(shape) != 4:
            raise SystemExit(f"bench_grn: shape {dims!r} is not N x H x W x C")
        out.append((shape, layout))
    return out


def main(argv: list[str] | None = None) -> int:
    run = common.variant_run_args(
        __doc__, "bench_grn", VARIANTS, "NxHxWxC:layout,... (nhwc, nchw, nchw-cl)", argv
    )
    args, names, rounds, repeats, out = run.args, run.variants, run.rounds, run.repeats, run.out
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    if common.cuda_missing(args.device, "bench_grn"):
        return 2
    torch.manual_seed(0)

    checks = common.check_each(shapes, check, args.device)  # correctness first
    copy_gbps = common.measure_copy_gbps(args.device)
    timed = common.time_each(
        shapes, lambda s, lay: time_shape(s, lay, names, rounds, repeats, args.device), args.device
    )
    rows = [row for shape_rows, _ in timed for row in shape_rows]
    source = timed[-1][1] if timed else ""
    add_ratios(rows, copy_gbps)
    path = write_results(
        out,
        rows,
        dtype="bf16",
        eps=EPS,
        eager=source,
        copy_bandwidth_gbps=copy_gbps,
        checks=checks,
        bytes_counted="minimum bytes (S: bytes of x): fwd 2S (read x, write y), fwd+bwd 5S "
        "(and read dy, x, write dx); kernel_bytes: gpushape's traffic, fwd 3S, fwd+bwd 8S",
        timing=f"CUDA-graph replays, CUDA events, {rounds} alternating rounds x {repeats} "
        "repeats, median; fwd with autograd recording; fwd+bwd = forward + "
        "torch.autograd.grad(y, (x, weight, bias), dy)",
    )
    print(f"wrote {path}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
