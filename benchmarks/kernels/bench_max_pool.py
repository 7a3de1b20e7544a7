"""Benchmark max_pool2d (ResNet-50's stem pool, 3x3 stride 2 padding 1) on one GPU.

    python benchmarks/kernels/bench_max_pool.py [--quick] [--shapes 256x64x112x112:cl,...]
                                                [--variants eager,compile,gpushape]
                                                [--out results/bench_max_pool.json]

1. Checks gpushape against PyTorch on the GPU first, at every shape: y equal to
   F.max_pool2d's bit for bit, dx equal to PyTorch's float32 dx rounded once to bf16 (the same
   values added in the same order), and the numeric gate of TESTING.md at batch 8.
2. Measures device copy bandwidth in the same run (gpushape.bench.copy_bandwidth_bytes_per_s)
   and reads the GPUSpec's attainable copy rate (datasheet x the copy fraction, calibrated
   where a profile ships for the chip).
3. Times, bf16, every variant
     eager    F.max_pool2d
     compile  torch.compile(F.max_pool2d) (default mode, dynamic=False)
     gpushape gpushape.kernels.max_pool2d
   in two directions, each replayed from a CUDA graph (GPU time alone: no host cost):
     fwd      the forward with autograd recording (x requires grad: indices are written)
     fwd+bwd  forward, then torch.autograd.grad(y, x, dy)
   alternating the variants round by round (gpushape.bench.compare: CUDA events, medians).
4. Writes the rows with bench.write_results (GPU, versions, date, command) to --out (default
   $OUT/bench_max_pool.json, OUT defaulting to ./out) and prints a table last.

GB/s counts minimum bytes (S_x, S_y: bytes of x and y; E_y: y's elements, one int8 tap each):
fwd S_x + S_y + E_y (read x; write y and the taps), fwd+bwd twice that (the backward reads the
taps and dy, writes dx). PyTorch's own kernels move 7 E_y more each way (int64 indices):
`torch_bytes` in the rows. --device cpu (TRITON_INTERPRET=1, tiny --shapes) smoke-tests the
script: no CUDA graphs, perf_counter timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, beside this script

import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, write_results
from gpushape.kernels import max_pool2d
from gpushape.kernels.pooling._geometry import pool_geometry

POOL = (3, 2, 1)  # kernel, stride, padding: ResNet's stem
DTYPE = torch.bfloat16
SHAPES = [  # (shape, layout)
    ((256, 64, 112, 112), "cl"),  # ResNet-50's stem pool at batch 256, as trained
    ((256, 64, 112, 112), "nchw"),
    ((32, 64, 112, 112), "cl"),
]
LAYOUTS = {"cl": torch.channels_last, "nchw": torch.contiguous_format}
VARIANTS = ("eager", "compile", "gpushape")
DIRECTIONS = ("fwd", "fwd+bwd")
CHECK_GATE_BATCH = 8  # the gate's float64 copies of the full stem would take 3.3 GB


# ---- bytes ---------------------------------------------------------------------------------
def min_bytes(shape, dtype: torch.dtype = DTYPE, pool=POOL) -> dict[str, int]:
    """Minimum bytes per direction: fwd reads x, writes y and a 1-byte tap an output; bwd reads
    the taps and dy, writes dx."""
    n, c, h, w = shape
    oh, ow = pool_geometry(*pool).output_size(h, w)
    item = torch.empty((), dtype=dtype).element_size()
    x_bytes, outputs = n * c * h * w * item, n * c * oh * ow
    y_bytes = outputs * item
    fwd = x_bytes + y_bytes + outputs
    bwd = outputs + y_bytes + x_bytes
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}


def torch_bytes(shape, dtype: torch.dtype = DTYPE, pool=POOL) -> dict[str, int]:
    """What PyTorch's kernels move: an int64 index an output instead of one byte."""
    n, c, h, w = shape
    oh, ow = pool_geometry(*pool).output_size(h, w)
    extra = 7 * n * c * oh * ow
    ours = min_bytes(shape, dtype, pool)
    return {"fwd": ours["fwd"] + extra, "fwd+bwd": ours["fwd+bwd"] + 2 * extra}


# ---- inputs, checks, variants ----------------------------------------------------------------
def make_inputs(shape, layout: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x (requires grad) and dy, bf16, in the layout."""
    fmt = LAYOUTS[layout]
    x = torch.randn(shape, device=device).to(DTYPE).contiguous(memory_format=fmt)
    n, c, h, w = shape
    oh, ow = pool_geometry(*POOL).output_size(h, w)
    dy = torch.randn((n, c, oh, ow), device=device).to(DTYPE).contiguous(memory_format=fmt)
    return x.requires_grad_(), dy


def _fwd_bwd(fn, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx


def check(shape, layout: str, device: str) -> str:
    """y equal to PyTorch's, dx equal to PyTorch's float32 dx rounded once, then the gate."""
    x, dy = make_inputs(shape, layout, device)
    y, dx = _fwd_bwd(lambda t: max_pool2d(t, *POOL), x, dy)
    y_ref = F.max_pool2d(x.detach(), *POOL)
    x32 = x.detach().float().requires_grad_()
    _, dx32 = _fwd_bwd(lambda t: F.max_pool2d(t, *POOL), x32, dy.float())
    if not torch.equal(y, y_ref):
        raise AssertionError(f"y differs from F.max_pool2d at {int((y != y_ref).sum())} places")
    # one bf16 unit of slack off the GPU: the interpreter rounds to bf16 by truncation
    rtol = 0.0 if device == "cuda" else 2.0**-7
    torch.testing.assert_close(
        dx, dx32.to(DTYPE), rtol=rtol, atol=0, msg=lambda m: f"dx vs float32 PyTorch: {m}"
    )
    small = x.detach()[:CHECK_GATE_BATCH].clone().requires_grad_()
    results = common.load_gate()(
        lambda t: max_pool2d(t, *POOL), lambda t: F.max_pool2d(t, *POOL), (small,), names=("x",)
    )
    worst = max(results, key=lambda g: g.err_ours / max(g.bound, 1e-30))
    return (
        f"pass (y equal; dx equal to float32 PyTorch rounded; gate tightest {worst.name}: "
        f"{worst.err_ours:.2e} <= {worst.bound:.2e})"
    )


def variants(names) -> dict:
    torch._dynamo.reset()  # a fresh static compile per shape
    fns = {
        "eager": lambda t: F.max_pool2d(t, *POOL),
        "compile": torch.compile(lambda t: F.max_pool2d(t, *POOL), dynamic=False),
        "gpushape": lambda t: max_pool2d(t, *POOL),
    }
    return {name: fns[name] for name in names}


# ---- timing --------------------------------------------------------------------------------
def time_shape(shape, layout: str, names, rounds: int, repeats: int, device: str) -> list[dict]:
    x, dy = make_inputs(shape, layout, device)
    fns = variants(names)
    makers = {
        "fwd": lambda fn: lambda: fn(x),
        "fwd+bwd": lambda fn: lambda: torch.autograd.grad(fn(x), x, dy),
    }
    ours_bytes, theirs_bytes = min_bytes(shape), torch_bytes(shape)
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
                    median_us=t.median_s * 1e6,
                    torch_bytes=theirs_bytes[direction],
                    **common.timing_figures(t, ours_bytes[direction]),
                )
            )
    return rows


def add_ratios(rows: list[dict], copy_gbps: float, spec_copy_gbps: float | None) -> None:
    """pct_copy (of this run's copy rate), pct_spec_copy (of the GPUSpec's), speedup_vs_*."""
    by_key = {(tuple(r["shape"]), r["layout"], r["direction"], r["variant"]): r for r in rows}
    for r in rows:
        r["pct_copy"] = r["gbps"] / copy_gbps
        r["pct_spec_copy"] = r["gbps"] / spec_copy_gbps if spec_copy_gbps else None
        for other in VARIANTS:
            base = by_key.get((tuple(r["shape"]), r["layout"], r["direction"], other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def spec_copy_gbps(device: str) -> tuple[float | None, str]:
    """The GPUSpec's attainable copy rate in GB/s and where it came from (None off a GPU or
    for a chip the catalog lacks)."""
    if device != "cuda":
        return None, "no GPU"
    from gpushape.errors import GpushapeError
    from gpushape.hardware import calibrated, current_gpu

    try:
        spec = calibrated(current_gpu())
    except GpushapeError as exc:
        return None, str(exc)
    return copy_gbps_of(spec)


def copy_gbps_of(spec) -> tuple[float, str]:
    """A GPUSpec's attainable copy rate in GB/s and where its numbers came from."""
    return spec.attainable_bandwidth_bytes_per_s() / 1e9, f"{spec.name} ({spec.achievable.source})"


def format_table(rows: list[dict]) -> str:
    """One line per (shape, layout, direction): each variant's median us, then gpushape's GB/s
    of minimum bytes, % of the copy rates and speed-ups."""
    lines = [
        "median us from CUDA-graph replays (CUDA events); GB/s from minimum bytes; %copy: of "
        "this run's copy rate; %spec: of the GPUSpec's attainable copy rate",
        f"{'shape':>16s} {'layout':6s} {'dir':8s}"
        + "".join(f"{v:>10s}" for v in VARIANTS)
        + f"{'GB/s':>7s}{'%copy':>7s}{'%spec':>7s}{'x eager':>9s}{'x comp':>8s}",
    ]
    keys = dict.fromkeys((tuple(r["shape"]), r["layout"], r["direction"]) for r in rows)
    for shape, layout, direction in keys:
        sel = {
            r["variant"]: r
            for r in rows
            if (tuple(r["shape"]), r["layout"], r["direction"]) == (shape, layout, direction)
        }
        us = "".join(
            f"{sel[v]['median_us']:10.1f}" if v in sel else f"{'n/a':>10s}" for v in VARIANTS
        )
        ours = sel.get("gpushape", {})
        spec = ours.get("pct_spec_copy")
        tail = (
            f"{ours['gbps']:7.0f}{100 * ours['pct_copy']:6.0f}%"
            + (f"{100 * spec:6.0f}%" if spec else f"{'n/a':>7s}")
            + "".join(
                f"{ours.get(f'speedup_vs_{v}', float('nan')):{w}.2f}"
                for v, w in (("eager", 9), ("compile", 8))
            )
            if ours
            else ""
        )
        name = "x".join(map(str, shape))
        lines.append(f"{name:>16s} {layout:6s} {direction:8s}{us}{tail}")
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[tuple[int, ...], str]]:
    """ "256x64x112x112:cl,32x64x56x56:nchw" -> [((256, 64, 112, 112), "cl"), ...]."""
    out = []
    for item in text.split(","):
        dims, _, layout = item.partition(":")
        layout = layout or "cl"
        if layout not in LAYOUTS:
            raise SystemExit(f"bench_max_pool: layout {layout!r} unknown; known: cl, nchw")
        out.append((common.parse_shapes(dims)[0], layout))
    return out


def main(argv: list[str] | None = None) -> int:
    run = common.variant_run_args(
        __doc__, "bench_max_pool", VARIANTS, "e.g. 256x64x112x112:cl,32x64x112x112:nchw", argv
    )
    args, names, rounds, repeats, out = run.args, run.variants, run.rounds, run.repeats, run.out
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    if common.cuda_missing(args.device, "bench_max_pool"):
        return 2
    torch.manual_seed(0)

    checks = common.check_each(shapes, check, args.device)  # correctness first
    copy_gbps = common.measure_copy_gbps(args.device)
    spec_gbps, spec_source = spec_copy_gbps(args.device)
    timed = common.time_each(
        shapes, lambda s, lay: time_shape(s, lay, names, rounds, repeats, args.device), args.device
    )
    rows = [row for shape_rows in timed for row in shape_rows]
    add_ratios(rows, copy_gbps, spec_gbps)
    path = write_results(
        out,
        rows,
        pool=dict(kernel_size=POOL[0], stride=POOL[1], padding=POOL[2]),
        dtype="bf16",
        copy_bandwidth_gbps=copy_gbps,
        spec_copy_bandwidth_gbps=spec_gbps,
        spec_source=spec_source,
        checks=checks,
        bytes_counted="minimum bytes: fwd S_x + S_y + E_y (1-byte taps); fwd+bwd twice that; "
        "torch_bytes: the same with PyTorch's 8-byte indices",
        timing=f"CUDA-graph replays, CUDA events, {rounds} alternating rounds x {repeats} "
        "repeats, median; fwd with autograd recording; fwd+bwd = forward + "
        "torch.autograd.grad(y, x, dy)",
    )
    print(f"wrote {path}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
