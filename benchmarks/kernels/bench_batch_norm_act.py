"""Benchmark batch_norm_act (BatchNorm2d in training + residual add + ReLU) on one GPU.

    python benchmarks/kernels/bench_batch_norm_act.py [--quick] [--shapes 256x256x56x56]
                                                      [--tuning out/tune_batch_norm_act.json]
                                                      [--activation silu]

1. Checks gpushape on the GPU first, at every shape: the numeric gate of TESTING.md (forward
   and the gradients of x, residual, weight, bias against float64) and the running stats
   against nn.BatchNorm2d.
2. Measures device copy bandwidth in the same run (gpushape.bench.copy_bandwidth_bytes_per_s).
3. At ResNet-50's stage shapes, batch 256, bf16, channels_last, BatchNorm in training, times
     eager    F.relu(nn.BatchNorm2d(x) + r) under torch.autocast(bf16), as the anchors
     compile  torch.compile (default mode, dynamic=False) of the same
     gpushape BatchNormAct2d(x, r)
   alternating the variants round by round (gpushape.bench.compare: CUDA events, medians):
     fwd      the forward, autograd recording (as in training)
     fwd+bwd  forward, then torch.autograd.grad w.r.t. x, r, weight, bias (no .grad
              accumulation; this is what a training step pays)
     fwd+bwd accum  forward, then .backward() into .grad that already exists: what the anchors
              (benchmarks/results/baselines-h200/h200-2026-11-30-resnet-split.json) timed;
              it adds x.grad += dx, r.grad += dr
     fwd+bwd graph  fwd+bwd replayed from a CUDA graph: GPU time alone, without the host's
              launch and autograd cost (which decides the eager rows at the small stages)
   --tuning FILE: gpushape with the launch configurations of a tune_batch_norm_act.py run
   (its "table", installed into _batch_norm_tuning.TUNED before anything runs).
4. Writes $OUT/bench_batch_norm_act.json (default ./out) and a PNG, prints a table last.

GB/s counts the anchors' minimum bytes, S = one (N, C, H, W) bf16 tensor: forward 4 S (read x
for the statistics, read x and r, write y); forward+backward 9 S. gpushape's own traffic is
4 1/16 S forward and 10 3/16 S forward+backward (ReLU mask 1 bit an element; the backward reads
dy, x, mask twice: once to reduce, once to write dx and dr): the `own GB/s` column uses it.
--activation silu|gelu|gelu_tanh|hardswish: that activation instead of ReLU, in every variant
(results in bench_batch_norm_act_<activation>.json); gpushape's own traffic is then 4 S forward
and 11 S forward+backward (no mask; the backward reads the residual to recompute the
pre-activation and writes dz as its gradient, which the dx pass reads back).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, beside this script

import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, write_results
from gpushape.kernels import BatchNormAct2d, batch_norm_act
from gpushape.kernels.batch_norm._tuning import load_table

gate_forward_backward = common.load_gate()

SHAPES = [(256, 64, 112, 112), (256, 256, 56, 56), (256, 512, 28, 28), (256, 1024, 14, 14)]
DTYPE = torch.bfloat16
DEVICE = "cuda"  # --device cpu (TRITON_INTERPRET=1, tiny --shapes) smoke-tests the script
VARIANTS = ("eager", "compile", "gpushape")
# Passes over one tensor: the anchors' minimum bytes, and what gpushape itself moves.
PASSES = {"fwd": 4.0, "fwd+bwd": 9.0, "fwd+bwd accum": 9.0, "fwd+bwd graph": 9.0}
OWN_PASSES = {"fwd": 4 + 1 / 16, "fwd+bwd": 10 + 3 / 16, "fwd+bwd graph": 10 + 3 / 16}
OWN_PASSES_SMOOTH = {"fwd": 4.0, "fwd+bwd": 11.0, "fwd+bwd graph": 11.0}  # --activation silu...
ACTIVATION = "relu"  # --activation
TORCH_ACT = {
    "relu": F.relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "hardswish": F.hardswish,
}
TARGETS = {"eager": 2.5, "compile": 1.5}  # the fwd+bwd speedups, every stage shape


def _name(shape) -> str:
    return "x".join(map(str, shape))


def _autocast():
    return torch.autocast(DEVICE, dtype=DTYPE)


def _make(shape):
    """x, r, dy (bf16, channels_last) and a BatchNorm2d with non-trivial parameters."""
    c = shape[1]
    x = (
        (0.5 * torch.randn(shape, device=DEVICE) - 1.0)
        .to(DTYPE)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_()
    )
    r = torch.randn_like(x).requires_grad_()
    dy = torch.randn_like(x)
    bn = nn.BatchNorm2d(c).to(DEVICE)
    with torch.no_grad():
        bn.weight.normal_(1.0, 0.2)
        bn.bias.normal_(0.0, 0.2)
    return x, r, dy, bn


def _bn_add_act(bn):
    return lambda x, r: TORCH_ACT[ACTIVATION](bn(x) + r)


def _own_passes() -> dict:
    return OWN_PASSES if ACTIVATION == "relu" else OWN_PASSES_SMOOTH


def _stem() -> str:
    """Result file name: bench_batch_norm_act[_<activation>]."""
    return "bench_batch_norm_act" + ("" if ACTIVATION == "relu" else f"_{ACTIVATION}")


def check(shape) -> str:
    """Numeric gate (forward and every gradient) and running stats vs nn.BatchNorm2d."""
    x, r, _, bn = _make(shape)

    def ours_fn(x, r, w, b):
        return batch_norm_act(x, w, b, None, None, True, activation=ACTIVATION, residual=r)

    def torch_fn(x, r, w, b):
        return TORCH_ACT[ACTIVATION](F.batch_norm(x, None, None, w, b, True) + r)

    results = gate_forward_backward(
        ours_fn, torch_fn, (x, r, bn.weight, bn.bias), names=("x", "residual", "weight", "bias")
    )
    worst = max(results, key=lambda g: g.err_ours / max(g.bound, 1e-30))
    ref = nn.BatchNorm2d(shape[1]).to(DEVICE)
    mine = BatchNormAct2d(shape[1], activation=ACTIVATION).to(DEVICE)
    with torch.no_grad():
        for _ in range(3):
            ref(x)
            mine(x, None)
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(mine.state_dict()[key], value, rtol=1e-5, atol=1e-5)
    return (
        f"pass (tightest: {worst.name} err {worst.err_ours:.2e} <= bound "
        f"{worst.bound:.2e}; running stats equal nn.BatchNorm2d's)"
    )


def variants(shape):
    """name -> (fn(x, r), parameters); one module per variant, same parameter values."""
    torch._dynamo.reset()  # a fresh static compile per shape, no cache-limit surprises
    x, r, dy, bn = _make(shape)
    bn_compiled = nn.BatchNorm2d(shape[1]).to(DEVICE)
    bn_compiled.load_state_dict(bn.state_dict())
    ours = BatchNormAct2d(shape[1], activation=ACTIVATION).to(DEVICE)
    ours.load_state_dict(bn.state_dict())
    compiled = torch.compile(_bn_add_act(bn_compiled), dynamic=False)
    fns = {
        "eager": (_bn_add_act(bn), bn),
        "compile": (compiled, bn_compiled),
        "gpushape": (ours, ours),
    }
    return x, r, dy, fns


def time_shape(shape, rounds: int, repeats: int) -> list[dict]:
    x, r, dy, fns = variants(shape)

    def fwd(fn):
        def run():
            with _autocast():
                fn(x, r)

        return run

    def fwd_bwd(fn, module):
        wrt = [x, r, module.weight, module.bias]

        def run():
            with _autocast():
                y = fn(x, r)
            torch.autograd.grad(y, wrt, dy)

        return run

    def fwd_bwd_accum(fn, _module):
        def run():
            with _autocast():
                y = fn(x, r)
            y.backward(dy)

        return run

    rows = []
    tensor_bytes = x.numel() * x.element_size()
    makers = {
        "fwd": lambda fn, m: fwd(fn),
        "fwd+bwd": fwd_bwd,
        "fwd+bwd accum": fwd_bwd_accum,
        "fwd+bwd graph": fwd_bwd,
    }
    for direction, make in makers.items():
        runs = {name: make(fn, module) for name, (fn, module) in fns.items()}
        if direction.endswith("graph"):  # GPU time alone: replayed from CUDA graphs
            runs = {
                name: g for name, f in runs.items() if (g := common.graphed(f, DEVICE)) is not None
            }
        for run in runs.values():  # compile, size grids, fill the caches: untimed
            for _ in range(3):
                run()
        timings = compare(runs, rounds=rounds, repeats_per_round=repeats, warmup=2, device=DEVICE)
        for name, t in timings.items():
            row = dict(
                shape=list(shape),
                direction=direction,
                variant=name,
                **common.timing_figures(t, PASSES[direction] * tensor_bytes),
            )
            if name == "gpushape" and direction in _own_passes():
                row["own_bytes"] = _own_passes()[direction] * tensor_bytes
                row["own_gbps"] = row["own_bytes"] / t.median_s / 1e9
            rows.append(row)
        for t in [x, r] + [p for _, module in fns.values() for p in module.parameters()]:
            t.grad = None  # what .backward() accumulated
    return rows


def add_speedups(rows: list[dict]) -> None:
    """Each row gets `speedup_vs_<variant>` = that variant's median / this row's median."""
    by_key = {(tuple(r["shape"]), r["direction"], r["variant"]): r for r in rows}
    for r in rows:
        for other in VARIANTS:
            base = by_key.get((tuple(r["shape"]), r["direction"], other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def criteria(rows: list[dict]) -> list[dict]:
    """The issue's done-when: fwd+bwd >= 2.5x eager and >= 1.5x compile at every stage shape."""
    out = []
    for r in rows:
        if r["variant"] != "gpushape" or r["direction"] not in ("fwd+bwd", "fwd+bwd graph"):
            continue
        for other, target in TARGETS.items():
            value = r.get(f"speedup_vs_{other}")
            out.append(
                dict(
                    criterion=f"{r['direction']} vs {other} @{_name(r['shape'])}",
                    value=value,
                    target=target,
                    verdict="PASS" if value and value >= target else "FAIL",
                )
            )
    return out


def plot(rows: list[dict], copy_gbps: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directions = ("fwd", "fwd+bwd", "fwd+bwd graph")
    fig, axes = plt.subplots(1, len(directions), figsize=(6 * len(directions), 4))
    shapes = [s for s in SHAPES if any(tuple(r["shape"]) == s for r in rows)]
    width = 0.8 / len(VARIANTS)
    for ax, direction in zip(axes, directions):
        for k, name in enumerate(VARIANTS):
            vals = [
                next(
                    (
                        r["gbps"]
                        for r in rows
                        if r["variant"] == name
                        and r["direction"] == direction
                        and tuple(r["shape"]) == s
                    ),
                    0.0,
                )
                for s in shapes
            ]
            ax.bar([i + k * width for i in range(len(shapes))], vals, width, label=name)
        ax.axhline(copy_gbps, color="k", ls="--", lw=1, label="copy (same run)")
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(shapes))],
            [_name(s) for s in shapes],
            fontsize=7,
        )
        ax.set_title(f"BN(train)+add+{ACTIVATION} {direction}, bf16 channels_last")
        ax.set_ylabel(f"GB/s ({PASSES[direction]:g} passes / median time)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(rows: list[dict], copy_gbps: float, verdicts: list[dict]) -> None:
    print(
        f"\ncopy bandwidth (same run): {copy_gbps:.0f} GB/s. Median ms by CUDA events. GB/s "
        f"from the anchors' minimum bytes (fwd 4, fwd+bwd 9 passes), %copy of the same run; "
        f"own GB/s: gpushape's actual traffic (fwd 4.06, fwd+bwd 10.19 passes)"
    )
    head = (
        f"{'shape':>17s} {'dir':13s}"
        + "".join(f"{v:>9s}" for v in VARIANTS)
        + "".join(f"{v[:7] + ' GB/s':>13s}" for v in VARIANTS)
        + f"{'%copy':>7s}{'own GB/s':>9s}{'x eager':>8s}{'x comp':>7s}"
    )
    print(head)
    for shape in SHAPES:
        for direction in PASSES:
            sel = {
                r["variant"]: r
                for r in rows
                if tuple(r["shape"]) == shape and r["direction"] == direction
            }
            if "gpushape" not in sel:
                continue
            ours = sel["gpushape"]
            ms = "".join(
                f"{sel[v]['median_ms']:9.3f}" if v in sel else f"{'n/a':>9s}" for v in VARIANTS
            )
            gbps = "".join(
                f"{sel[v]['gbps']:13.0f}" if v in sel else f"{'n/a':>13s}" for v in VARIANTS
            )
            own = f"{ours['own_gbps']:9.0f}" if "own_gbps" in ours else f"{'':9s}"
            print(
                f"{_name(shape):>17s} {direction:13s}{ms}{gbps}"
                f"{100 * ours['gbps'] / copy_gbps:6.0f}%{own}"
                f"{ours.get('speedup_vs_eager', float('nan')):8.2f}"
                f"{ours.get('speedup_vs_compile', float('nan')):7.2f}"
            )
    print()
    for v in verdicts:
        value = "n/a" if v["value"] is None else f"{v['value']:.2f}"
        print(f"{v['verdict']:5s} {v['criterion']}: {value}x (target >= {v['target']:g}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats; correctness checks at batch 32 instead of 256",
    )
    parser.add_argument(
        "--shapes",
        default="",
        help="e.g. 256x256x56x56,32x64x112x112 "
        "(default: ResNet-50's four stage shapes at batch 256)",
    )
    parser.add_argument(
        "--tuning",
        default="",
        help="a tune_batch_norm_act.py JSON: use its launch configurations (table) for gpushape",
    )
    parser.add_argument("--activation", default="relu", choices=sorted(TORCH_ACT))
    common.add_device_arg(parser)
    args = parser.parse_args(argv)
    global DEVICE, SHAPES, ACTIVATION
    DEVICE, ACTIVATION = args.device, args.activation
    if args.shapes:
        SHAPES = common.parse_shapes(args.shapes)
    if common.cuda_missing(DEVICE, "bench_batch_norm_act"):
        return 2
    rounds, repeats = (3, 5) if args.quick else (5, 10)
    tuned = (
        {f"{c}x{m}": str(t) for (c, m), t in load_table(args.tuning).items()} if args.tuning else {}
    )
    out_dir = Path(os.environ.get("OUT", "out"))
    torch.manual_seed(0)

    checks = {}
    for shape in SHAPES:  # correctness first
        checked = (min(shape[0], 32), *shape[1:]) if args.quick else shape
        checks[_name(checked)] = check(checked)
        print(f"check {_name(checked)}: {checks[_name(checked)]}", flush=True)
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    copy_gbps = common.measure_copy_gbps(DEVICE)

    rows = []
    for shape in SHAPES:
        rows += time_shape(shape, rounds, repeats)
        print(f"timed {_name(shape)}", flush=True)
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    add_speedups(rows)
    common.add_pct_copy(rows, copy_gbps)
    verdicts = criteria(rows)
    path = write_results(
        out_dir / f"{_stem()}.json",
        rows,
        copy_bandwidth_gbps=copy_gbps,
        dtype="bf16",
        layout="channels_last",
        activation=ACTIVATION,
        checks=checks,
        criteria=verdicts,
        tuning_file=args.tuning or None,
        tuning_table=tuned,
        bytes_counted=(
            "anchors' minimum bytes in units of one (N, C, H, W) bf16 tensor: fwd 4, "
            "fwd+bwd 9; own_bytes: gpushape's traffic, fwd 4+1/16, fwd+bwd 10+3/16 (ReLU); "
            "fwd 4, fwd+bwd 11 (the others)"
        ),
        timing=(
            f"CUDA events, {rounds} alternating rounds x {repeats} repeats, median; under "
            "torch.autocast(bf16); fwd with autograd recording; fwd+bwd = forward + "
            "torch.autograd.grad w.r.t. x, r, weight, bias; 'fwd+bwd accum' = forward + "
            ".backward() into existing .grad, as the anchors"
        ),
    )
    plot(rows, copy_gbps, out_dir / f"{_stem()}.png")
    print(f"wrote {path} and {out_dir / f'{_stem()}.png'}")
    print_table(rows, copy_gbps, verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
