"""Benchmark GroupNorm followed by an activation on one GPU.

    python benchmarks/kernels/bench_group_norm.py [--quick]
                                                  [--shapes 64x256x56x56:32:relu:nchw,...]
                                                  [--variants eager,compile,gpushape]
                                                  [--out results/bench_group_norm.json]

A case is N x C x H x W, the number of groups, the activation after the norm (none, relu, silu,
gelu, gelu_tanh, hardswish) and the layout: nchw (contiguous) or nchw-cl (the same tensor in
channels_last memory). The defaults, at the batches the models train at:
  - ResNet-50-GN's (timm resnet50_gn: GroupNorm(32, C) then ReLU) at batch 64, one a stage;
  - PoolFormerV2-S12's GroupNorm1 (one group, no activation) at its first and last stage;
  - a Stable-Diffusion-UNet-like GroupNorm(32, 320) then SiLU at 8 x 64 x 64, in both layouts.
--quick keeps three of them (a ResNet stage, a PoolFormer one, the channels_last UNet one) and
runs fewer rounds.

1. Checks gpushape against PyTorch's composition on the GPU first, at every case cut to batch 8:
   the numeric gate of TESTING.md on y and the gradients of x, weight and bias.
2. Measures device copy bandwidth in the same run (gpushape.bench.copy_bandwidth_bytes_per_s).
3. Times, bf16 (x, weight and bias), every variant
     eager    nn.GroupNorm then the activation module (PyTorch's kernels)
     compile  torch.compile of that (default mode, dynamic=False)
     gpushape gpushape.kernels.GroupNormAct.from_module(the GroupNorm, activation)
   in two directions, each replayed from a CUDA graph (GPU time alone: no host cost):
     fwd      the forward with autograd recording (x, weight and bias require grad)
     fwd+bwd  forward, then torch.autograd.grad(y, (x, weight, bias), dy)
   alternating the variants round by round (gpushape.bench.compare: CUDA events, medians).
4. Writes the rows with bench.write_results (GPU, versions, date, command) to --out (default
   $OUT/bench_group_norm.json, OUT defaulting to ./out) and prints a table last.

GB/s counts minimum bytes (S: the bytes of x): fwd 2 S (read x, write y), fwd+bwd 5 S (and read
dy and x, write dx). gpushape's kernels move 3 S and 8 S (they read x twice a direction, and dy
twice): `kernel_bytes` and `kernel_gbps` in the rows. --device cpu (TRITON_INTERPRET=1, tiny
--shapes) smoke-tests the script: no CUDA graphs, perf_counter timing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, beside this script

import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, write_results
from gpushape.kernels import GroupNormAct, group_norm_act

EPS = 1e-5
DTYPE = torch.bfloat16
# activation -> (its module, its function), as the eager variant and the gate's reference run it
ACTIVATIONS = {
    "none": (nn.Identity, lambda y: y),
    "relu": (nn.ReLU, F.relu),
    "silu": (nn.SiLU, F.silu),
    "gelu": (nn.GELU, F.gelu),
    "gelu_tanh": (lambda: nn.GELU(approximate="tanh"), lambda y: F.gelu(y, approximate="tanh")),
    "hardswish": (nn.Hardswish, F.hardswish),
}
LAYOUTS = {"nchw": torch.contiguous_format, "nchw-cl": torch.channels_last}


@dataclass(frozen=True)
class Case:
    """What a shape is normalized with: groups, the activation after, the layout of x."""

    groups: int
    activation: str
    layout: str

    def __str__(self) -> str:  # the --shapes spelling after the dimensions (and shape_key's)
        return f"{self.groups}:{self.activation}:{self.layout}"


SHAPES = [  # ((N, C, H, W), Case)
    # ResNet-50-GN (timm resnet50_gn: GroupNorm(32, C) then ReLU) at batch 64: a stage each
    ((64, 64, 112, 112), Case(32, "relu", "nchw")),
    ((64, 256, 56, 56), Case(32, "relu", "nchw")),
    ((64, 512, 28, 28), Case(32, "relu", "nchw")),
    ((64, 1024, 14, 14), Case(32, "relu", "nchw")),
    # PoolFormerV2-S12's GroupNorm1 (one group, no activation): its first and last stage
    ((64, 64, 56, 56), Case(1, "none", "nchw")),
    ((64, 512, 7, 7), Case(1, "none", "nchw")),
    # a Stable-Diffusion UNet's first-level GroupNorm(32, 320) then SiLU, in both layouts
    ((8, 320, 64, 64), Case(32, "silu", "nchw")),
    ((8, 320, 64, 64), Case(32, "silu", "nchw-cl")),
]
QUICK_SHAPES = [SHAPES[1], SHAPES[4], SHAPES[7]]
VARIANTS = ("eager", "compile", "gpushape")
DIRECTIONS = ("fwd", "fwd+bwd")
MIN_FACTOR = {"fwd": 2, "fwd+bwd": 5}  # minimum traffic in units of S, the bytes of x
KERNEL_FACTOR = {"fwd": 3, "fwd+bwd": 8}  # what gpushape's kernels move
CHECK_GATE_BATCH = 8  # the gate's float64 copies at batch 64: 0.4 GB a tensor (ResNet's first)


# ---- bytes ---------------------------------------------------------------------------------
def x_bytes(shape, dtype: torch.dtype = DTYPE) -> int:
    n, c, h, w = shape
    return n * c * h * w * torch.empty((), dtype=dtype).element_size()


def min_bytes(shape, dtype: torch.dtype = DTYPE) -> dict[str, int]:
    """Minimum bytes per direction: fwd reads x and writes y; the backward adds reading dy and
    x and writing dx."""
    s = x_bytes(shape, dtype)
    return {d: k * s for d, k in MIN_FACTOR.items()}


def kernel_bytes(shape, dtype: torch.dtype = DTYPE) -> dict[str, int]:
    """What gpushape's kernels move (`kernels/group_norm`): 3 S forward, 5 S backward."""
    s = x_bytes(shape, dtype)
    return {d: k * s for d, k in KERNEL_FACTOR.items()}


# ---- inputs, checks, variants ----------------------------------------------------------------
def torch_group_norm_act(x, weight, bias, groups: int, activation: str, eps: float = EPS):
    """PyTorch's composition on plain tensors: act(F.group_norm(x, ...))."""
    return ACTIVATIONS[activation][1](F.group_norm(x, groups, weight, bias, eps))


def make_inputs(shape, case: Case, device: str, batch: int | None = None):
    """x (requiring grad), weight and bias (parameters) and dy, bf16, x and dy in the case's
    layout; weight and bias random (nn.GroupNorm's ones and zeros would hide their scaling)."""
    fmt = LAYOUTS[case.layout]
    n, c, h, w = shape
    n = n if batch is None else min(n, batch)
    full = (n, c, h, w)
    x = (0.7 * torch.randn(full, device=device) - 0.3).to(DTYPE).contiguous(memory_format=fmt)
    dy = torch.randn(full, device=device).to(DTYPE).contiguous(memory_format=fmt)
    weight = nn.Parameter((1 + 0.5 * torch.randn(c, device=device)).to(DTYPE))
    bias = nn.Parameter((0.5 * torch.randn(c, device=device)).to(DTYPE))
    return x.requires_grad_(), weight, bias, dy


def eager_modules(case: Case, weight, bias) -> tuple[nn.GroupNorm, nn.Module, str]:
    """(the GroupNorm over these very parameters, it then the activation module, source)."""
    c = weight.numel()
    gn = nn.GroupNorm(case.groups, c, eps=EPS, device=weight.device, dtype=weight.dtype)
    gn.weight, gn.bias = weight, bias  # the very parameters the other variants take
    act = ACTIVATIONS[case.activation][0]()
    source = f"torch {torch.__version__} nn.GroupNorm then nn.{type(act).__name__}"
    return gn, nn.Sequential(gn, act), source


def check(shape, case: Case, device: str) -> str:
    """The numeric gate on y and every gradient, at batch CHECK_GATE_BATCH."""
    x, w, b, _ = make_inputs(shape, case, device, batch=CHECK_GATE_BATCH)
    g, act = case.groups, case.activation
    results = common.load_gate()(
        lambda x, w, b: group_norm_act(x, g, w, b, EPS, act),
        lambda x, w, b: torch_group_norm_act(x, w, b, g, act),
        (x, w, b),
        names=("x", "weight", "bias"),
    )
    worst = max(results, key=lambda r: r.err_ours / max(r.bound, 1e-30))
    return f"pass (gate tightest {worst.name}: {worst.err_ours:.2e} <= {worst.bound:.2e})"


def variants(names, case: Case, weight, bias) -> tuple[dict, str]:
    torch._dynamo.reset()  # a fresh static compile per shape
    gn, eager, source = eager_modules(case, weight, bias)
    fns = {
        "eager": eager,
        "compile": torch.compile(eager, dynamic=False) if "compile" in names else None,
        "gpushape": GroupNormAct.from_module(gn, activation=case.activation),
    }
    return {name: fns[name] for name in names}, source


# ---- timing --------------------------------------------------------------------------------
def time_shape(shape, case: Case, names, rounds: int, repeats: int, device: str):
    """(rows, the eager variant's source)."""
    x, w, b, dy = make_inputs(shape, case, device)
    fns, source = variants(names, case, w, b)
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
                    groups=case.groups,
                    activation=case.activation,
                    layout=case.layout,
                    direction=direction,
                    variant=name,
                    kernel_bytes=kernel[direction],
                    kernel_gbps=kernel[direction] / t.median_s / 1e9,
                    **common.timing_figures(t, least[direction]),
                )
            )
    return rows, source


def _key(r: dict, variant: str) -> tuple:
    return (tuple(r["shape"]), r["groups"], r["activation"], r["layout"], r["direction"], variant)


def add_ratios(rows: list[dict], copy_gbps: float) -> None:
    """pct_copy (of this run's copy rate, minimum bytes) and speedup_vs_* of every row."""
    by_key = {_key(r, r["variant"]): r for r in rows}
    for r in rows:
        r["pct_copy"] = r["gbps"] / copy_gbps
        for other in VARIANTS:
            base = by_key.get(_key(r, other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def format_table(rows: list[dict]) -> str:
    """One line a (shape, case, direction, variant): median ms, GB/s of minimum bytes, % of
    the copy rate, gpushape's GB/s of its own traffic, speed-up over eager."""
    lines = [
        "median ms from CUDA-graph replays (CUDA events); GB/s: minimum bytes (fwd 2S, fwd+bwd "
        "5S); %copy: of this run's copy rate; kern: gpushape's own traffic (3S, 8S)",
        f"{'shape':>17s}{'g':>4s} {'act':9s} {'layout':7s} {'dir':8s}{'variant':>9s}{'ms':>9s}"
        f"{'GB/s':>7s}{'%copy':>7s}{'kern':>7s}{'x eager':>9s}",
    ]
    for r in rows:
        kern = f"{r['kernel_gbps']:7.0f}" if r["variant"] == "gpushape" else f"{'':>7s}"
        ratio = r.get("speedup_vs_eager", 1.0 if r["variant"] == "eager" else float("nan"))
        name = "x".join(map(str, r["shape"]))
        lines.append(
            f"{name:>17s}{r['groups']:4d} {r['activation']:9s} {r['layout']:7s} "
            f"{r['direction']:8s}{r['variant']:>9s}{r['median_ms']:9.3f}{r['gbps']:7.0f}"
            f"{100 * r['pct_copy']:6.0f}%{kern}{ratio:9.2f}"
        )
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[tuple[int, ...], Case]]:
    """ "64x256x56x56:32:relu:nchw,8x320x64x64:32:silu:nchw-cl" -> [((64, 256, 56, 56),
    Case(32, "relu", "nchw")), ...]: N x C x H x W, then groups (default 32), activation
    (default none) and layout (default nchw), each optional from the right."""
    out = []
    for item in text.split(","):
        dims, *rest = item.split(":")
        if len(rest) > 3:
            raise SystemExit(f"bench_group_norm: {item!r} is not NxCxHxW:groups:act:layout")
        groups, activation, layout = [*rest, *("32", "none", "nchw")[len(rest) :]]
        shape = common.parse_shapes(dims)[0]
        if len(shape) != 4:
            raise SystemExit(f"bench_group_norm: shape {dims!r} is not N x C x H x W")
        if layout not in LAYOUTS:
            raise SystemExit(
                f"bench_group_norm: layout {layout!r} unknown; known: {', '.join(LAYOUTS)}"
            )
        if activation not in ACTIVATIONS:
            raise SystemExit(
                f"bench_group_norm: activation {activation!r} unknown; known: "
                f"{', '.join(ACTIVATIONS)}"
            )
        if not groups.isdigit() or int(groups) < 1 or shape[1] % int(groups):
            raise SystemExit(
                f"bench_group_norm: {groups!r} groups do not divide {shape[1]} channels"
            )
        out.append((shape, Case(int(groups), activation, layout)))
    return out


def main(argv: list[str] | None = None) -> int:
    run = common.variant_run_args(
        __doc__,
        "bench_group_norm",
        VARIANTS,
        "NxCxHxW[:groups[:activation[:layout]]],... (defaults 32, none, nchw; layouts nchw, "
        "nchw-cl)",
        argv,
    )
    args, names, rounds, repeats, out = run.args, run.variants, run.rounds, run.repeats, run.out
    default = QUICK_SHAPES if args.quick else SHAPES
    shapes = parse_shapes(args.shapes) if args.shapes else default
    if common.cuda_missing(args.device, "bench_group_norm"):
        return 2
    torch.manual_seed(0)

    checks = common.check_each(shapes, check, args.device)  # correctness first
    copy_gbps = common.measure_copy_gbps(args.device)
    timed = common.time_each(
        shapes,
        lambda s, case: time_shape(s, case, names, rounds, repeats, args.device),
        args.device,
    )
    rows = [row for shape_rows, _ in timed for row in shape_rows]
    source = "; ".join(sorted({src for _, src in timed}))  # one an activation
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
