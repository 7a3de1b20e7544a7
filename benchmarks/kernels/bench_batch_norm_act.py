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
from batch_norm_act_report import PASSES, add_speedups, criteria, plot, print_table, shape_name

from gpushape.bench import compare, write_results
from gpushape.kernels import BatchNormAct2d, batch_norm_act
from gpushape.kernels.batch_norm._tuning import load_table

gate_forward_backward = common.load_gate()

SHAPES = [(256, 64, 112, 112), (256, 256, 56, 56), (256, 512, 28, 28), (256, 1024, 14, 14)]
DTYPE = torch.bfloat16
DEVICE = "cuda"  # --device cpu (TRITON_INTERPRET=1, tiny --shapes) smoke-tests the script
# What gpushape itself moves, in passes over one tensor (the anchors' minimum bytes: PASSES).
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
        checks[shape_name(checked)] = check(checked)
        print(f"check {shape_name(checked)}: {checks[shape_name(checked)]}", flush=True)
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    copy_gbps = common.measure_copy_gbps(DEVICE)

    rows = []
    for shape in SHAPES:
        rows += time_shape(shape, rounds, repeats)
        print(f"timed {shape_name(shape)}", flush=True)
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
    plot(rows, copy_gbps, out_dir / f"{_stem()}.png", SHAPES, ACTIVATION)
    print(f"wrote {path} and {out_dir / f'{_stem()}.png'}")
    print_table(rows, copy_gbps, verdicts, SHAPES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
