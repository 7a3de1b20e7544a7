"""Benchmark the fused norms against eager PyTorch, torch.compile and Liger-Kernel, on one GPU.

    python benchmarks/kernels/bench_norms.py [--quick] [--ops layer_norm_gelu,rms_norm] [--sweep]

1. Checks every op on the GPU first (the numeric gate of TESTING.md, forward and every gradient).
2. Measures device copy bandwidth in the same run (gpushape.bench.copy_bandwidth_bytes_per_s).
3. Times eager / torch.compile (default mode) / Liger / gpushape, forward (under no_grad) and
   forward+backward (outputs, then torch.autograd.grad for every input: no .grad accumulation),
   alternating the variants round by round (gpushape.bench.compare, CUDA events, medians), bf16;
   and forward+backward replayed from a CUDA graph ("fwd+bwd graph": GPU time alone, without
   the host's launch and autograd cost, which the eager rows include when it is the larger).
4. Writes $OUT/bench_norms.json (default ./out) and $OUT/bench_norms.png, prints a table last.

GB/s counts minimum bytes (S = the size in bytes of one (M, N) tensor; parameters and (M,)
statistics are negligible and not counted):
  layer_norm_gelu, rms_norm: forward 2 S (read x, write y); forward+backward 5 S (+ read x, dy,
  write dx). add_layer_norm: forward 4 S (read x, residual; write y, x + residual);
  forward+backward 8 S (+ read the sum, dy, d_sum; write one gradient shared by x and residual).
--sweep times layer_norm_gelu under alternative launch heuristics (gpushape's NormTuning).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench_common, norms_report

import _bench_common as common  # first: it puts this working tree's src/ on the path
from norms_report import add_speedups, criteria, plot, print_table

from gpushape.bench import Timing, compare, write_results
from gpushape.kernels import add_layer_norm, layer_norm_gelu, rms_norm
from gpushape.kernels.norms._common import norm_tuning

gate_forward_backward = common.load_gate()

SHAPES = [(32768, 4096), (262144, 768), (8192, 8192), (4096, 16384)]
DTYPE = torch.bfloat16
LIGER_ERRORS: dict[str, str] = {}  # op -> why Liger did not run
DEVICE = "cuda"  # --device cpu (with TRITON_INTERPRET=1 and tiny --shapes) smoke-tests the script
CALLS_PER_TIMING = 5  # back-to-back calls per CUDA-event pair (see timed_per_call)


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    rows: int  # row tensors: x (and residual)
    params: int  # (N,) parameters: weight (and bias)
    outputs: int  # y (and x + residual)
    fwd_passes: int  # minimum bytes, in units of one (M, N) tensor
    fwd_bwd_passes: int
    ours: Callable
    torch_fn: Callable
    liger: Callable[[int], Callable | None]  # N -> module-backed fn(*inputs), or None


def _torch_ln_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b, 1e-5))


def _torch_add_ln(x, r, w, b):
    s = x + r
    return F.layer_norm(s, s.shape[-1:], w, b, 1e-5), s


def _torch_rms(x, w):
    return F.rms_norm(x, x.shape[-1:], w, 1e-6)


def _liger_module(kind: str, n: int):
    """Liger's LayerNorm / RMSNorm on the GPU in bf16, or None with the reason printed."""
    try:
        from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm
    except Exception as exc:  # not installed: reported as not run
        print(f"liger: not run ({type(exc).__name__}: {exc})")
        return None
    module = (
        LigerLayerNorm(n, eps=1e-5, bias=True)
        if kind == "ln"
        else LigerRMSNorm(n, eps=1e-6, in_place=False)
    )  # in_place would overwrite dy
    return module.to(DEVICE, DTYPE)


def _liger_ln_gelu(n):
    m = _liger_module("ln", n)
    return None if m is None else (m, lambda x, w, b: F.gelu(m(x)))


def _liger_add_ln(n):
    m = _liger_module("ln", n)
    return None if m is None else (m, lambda x, r, w, b: (m(x + r), x + r))


def _liger_rms(n):
    m = _liger_module("rms", n)
    return None if m is None else (m, lambda x, w: m(x))


OPS = {
    "layer_norm_gelu": Op(
        "layer_norm_gelu", 1, 2, 1, 2, 5, layer_norm_gelu, _torch_ln_gelu, _liger_ln_gelu
    ),
    "add_layer_norm": Op(
        "add_layer_norm", 2, 2, 2, 4, 8, add_layer_norm, _torch_add_ln, _liger_add_ln
    ),
    "rms_norm": Op(
        "rms_norm", 1, 1, 1, 2, 5, lambda x, w: rms_norm(x, w, 1e-6), _torch_rms, _liger_rms
    ),
}


def make_inputs(op: Op, m: int, n: int) -> list[torch.Tensor]:
    rows = [(0.5 * torch.randn(m, n, device=DEVICE) - 1.0).to(DTYPE) for _ in range(op.rows)]
    params = [torch.randn(n, device=DEVICE).to(DTYPE) for _ in range(op.params)]
    return [t.requires_grad_() for t in rows + params]


def check(op: Op, m: int, n: int) -> str:
    """The numeric gate on the GPU; returns a one-line summary (raises on failure)."""
    inputs = make_inputs(op, m, n)
    names = ["x", "residual"][: op.rows] + ["weight", "bias"][: op.params]
    results = gate_forward_backward(op.ours, op.torch_fn, inputs, names=names)
    worst = max(results, key=lambda r: r.err_ours / max(r.bound, 1e-30))
    return f"pass (tightest: {worst.name} err {worst.err_ours:.2e} <= bound {worst.bound:.2e})"


def variants_for(op: Op, inputs: list[torch.Tensor], n: int) -> dict[str, tuple]:
    """name -> (forward fn, tensors to differentiate w.r.t.)."""
    torch._dynamo.reset()  # a fresh static compile per shape, no cache-limit surprises
    compiled = torch.compile(op.torch_fn, dynamic=False)
    out = {
        "eager": (lambda: op.torch_fn(*inputs), inputs),
        "compile": (lambda: compiled(*inputs), inputs),
    }
    liger = op.liger(n)
    if liger is not None:
        module, fn = liger
        with torch.no_grad():  # same parameter values as the other variants
            for p, src in zip(module.parameters(), inputs[op.rows :]):
                p.copy_(src)
        grads_wrt = inputs[: op.rows] + list(module.parameters())[: op.params]
        try:  # a Liger that cannot run here (version skew, device) is reported, not fatal
            outs = _as_list(fn(*inputs))
            torch.autograd.grad(outs, grads_wrt, [torch.ones_like(o) for o in outs])
            out["liger"] = (lambda: fn(*inputs), grads_wrt)
        except Exception as exc:
            LIGER_ERRORS[op.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"liger: not run for {op.name} ({LIGER_ERRORS[op.name]})")
    out["gpushape"] = (lambda: op.ours(*inputs), inputs)
    return out


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def timed_per_call(
    fns: dict[str, Callable[[], object]], rounds: int, repeats: int, calls: int
) -> dict[str, Timing]:
    """compare() over `calls` back-to-back calls per timed region, reported per call.

    gpushape.bench.time_fn synchronises after every repeat, so a lone call would also time the
    Python launch path (custom-op dispatch, Triton launch: tens of microseconds) while the GPU
    waits. Back-to-back calls let the CPU run ahead and fill the queue, as it does in a training
    step; every variant is measured the same way."""

    def batch(fn):
        def run():
            for _ in range(calls):
                fn()

        return run

    timings = compare(
        {name: batch(fn) for name, fn in fns.items()},
        rounds=rounds,
        repeats_per_round=repeats,
        warmup=1,
        device=DEVICE,
    )
    return {
        name: dataclasses.replace(t, times_s=tuple(v / calls for v in t.times_s))
        for name, t in timings.items()
    }


def time_op(op: Op, m: int, n: int, rounds: int, repeats: int) -> list[dict]:
    inputs = make_inputs(op, m, n)
    grads_out = [torch.randn(m, n, device=DEVICE, dtype=DTYPE) for _ in range(op.outputs)]
    variants = variants_for(op, inputs, n)

    def fwd(fn):
        def run():
            with torch.no_grad():
                fn()

        return run

    def fwd_bwd(fn, wrt):
        return lambda: torch.autograd.grad(_as_list(fn()), wrt, grads_out)

    rows = []
    tensor_bytes = m * n * DTYPE.itemsize
    for direction, passes in (
        ("fwd", op.fwd_passes),
        ("fwd+bwd", op.fwd_bwd_passes),
        ("fwd+bwd graph", op.fwd_bwd_passes),
    ):
        fns = {
            name: (fwd(fn) if direction == "fwd" else fwd_bwd(fn, wrt))
            for name, (fn, wrt) in variants.items()
        }
        if direction.endswith("graph"):  # GPU time alone: replayed from CUDA graphs
            fns = {
                name: g for name, f in fns.items() if (g := common.graphed(f, DEVICE)) is not None
            }
        for f in fns.values():  # compile and autotune outside the timed rounds
            for _ in range(3):
                f()
        timings = timed_per_call(fns, rounds, repeats, CALLS_PER_TIMING)
        for name, t in timings.items():
            rows.append(
                dict(
                    op=op.name,
                    shape=[m, n],
                    direction=direction,
                    variant=name,
                    **common.timing_figures(t, passes * tensor_bytes),
                )
            )
    return rows


def sweep(rounds: int, repeats: int) -> list[dict]:
    """layer_norm_gelu under alternative launch heuristics, fwd and fwd+bwd, at every shape."""
    options = [
        dict(),
        dict(bf16_fast_gelu=False),
        dict(bwd_elems_per_thread=4),
        dict(bwd_elems_per_thread=16),
        dict(bwd_warps_per_sm=32),
        dict(bwd_warps_per_sm=8),
        dict(bwd_tile_elems=4096),
        dict(prefetch2_max_elems_per_thread=0),
        dict(fwd_tile_elems=8192),
        dict(fwd_tile_elems=2048),
        dict(fwd_elems_per_thread=8),
        dict(fwd_elems_per_thread=32),
        dict(fwd_tile_elems=8192, fwd_elems_per_thread=32),
        dict(fwd_max_block_n=8192),
        dict(bwd_max_block_n=4096),
    ]
    op = OPS["layer_norm_gelu"]
    out = []
    for m, n in SHAPES:
        inputs = make_inputs(op, m, n)
        gy = torch.randn(m, n, device=DEVICE, dtype=DTYPE)

        def fwd(inputs=inputs):
            with torch.no_grad():
                op.ours(*inputs)

        def fwd_bwd(inputs=inputs, gy=gy):
            torch.autograd.grad(op.ours(*inputs), inputs, gy)

        for changes in options:
            with norm_tuning(**changes):
                fwd()  # compile this configuration's kernels untimed
                fwd_bwd()
                t = timed_per_call(
                    {"fwd": fwd, "fwd+bwd": fwd_bwd}, rounds, repeats, CALLS_PER_TIMING
                )
            label = ",".join(f"{k}={v}" for k, v in changes.items()) or "defaults"
            out.append(
                dict(
                    shape=[m, n],
                    tuning=label,
                    fwd_ms=t["fwd"].median_s * 1e3,
                    fwd_bwd_ms=t["fwd+bwd"].median_s * 1e3,
                )
            )
            print(
                f"sweep {m}x{n} {label:28s} fwd {out[-1]['fwd_ms']:.3f} ms  "
                f"fwd+bwd {out[-1]['fwd_bwd_ms']:.3f} ms",
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats; checks on slices")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of ops")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also time layer_norm_gelu under alternative launch heuristics",
    )
    parser.add_argument(
        "--shapes", default="", help="e.g. 8192x4096,1024x768 (default: the issue's four shapes)"
    )
    common.add_device_arg(parser)
    args = parser.parse_args(argv)
    global DEVICE, SHAPES
    DEVICE = args.device
    if args.shapes:
        SHAPES = common.parse_shapes(args.shapes)
    if common.cuda_missing(DEVICE, "bench_norms"):
        return 2
    ops = [OPS[name] for name in args.ops.split(",")]
    rounds, repeats = (3, 5) if args.quick else (5, 10)
    out_dir = Path(os.environ.get("OUT", "out"))
    torch.manual_seed(0)

    started_s = time.perf_counter()
    checks = {}
    for op in ops:  # correctness first, at every shape (row slices with --quick)
        for m, n in SHAPES:
            rows_checked = min(m, 4096) if args.quick else m
            checks[f"{op.name} {rows_checked}x{n}"] = check(op, rows_checked, n)
            print(
                f"check {op.name} {rows_checked}x{n}: {checks[f'{op.name} {rows_checked}x{n}']}",
                flush=True,
            )
    copy_gbps = common.measure_copy_gbps(DEVICE)

    rows = []
    for op in ops:
        for m, n in SHAPES:
            rows += time_op(op, m, n, rounds, repeats)
            print(
                f"timed {op.name} {m}x{n} ({time.perf_counter() - started_s:.0f} s in)", flush=True
            )
            torch.cuda.empty_cache()
    add_speedups(rows)
    common.add_pct_copy(rows, copy_gbps)
    verdicts = criteria(rows, copy_gbps)
    swept = sweep(rounds, repeats) if args.sweep else None
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        liger = version("liger-kernel")
    except Exception as exc:
        liger = f"not run ({type(exc).__name__})"
    path = write_results(
        out_dir / "bench_norms.json",
        rows,
        copy_bandwidth_gbps=copy_gbps,
        dtype="bf16",
        liger_kernel=liger,
        liger_errors=LIGER_ERRORS,
        checks=checks,
        criteria=verdicts,
        sweep=swept,
        bytes_counted=(
            "minimum bytes in units of one (M, N) bf16 tensor: layer_norm_gelu and "
            "rms_norm fwd 2, fwd+bwd 5; add_layer_norm fwd 4, fwd+bwd 8"
        ),
        timing=(
            f"CUDA events around {CALLS_PER_TIMING} back-to-back calls, divided by "
            f"{CALLS_PER_TIMING}; {rounds} alternating rounds x {repeats} repeats, median; "
            f"fwd under no_grad, fwd+bwd = outputs + torch.autograd.grad w.r.t. all inputs"
        ),
    )
    plot(rows, copy_gbps, SHAPES, out_dir / "bench_norms.png")
    print(f"wrote {path} and {out_dir / 'bench_norms.png'}")
    print_table(rows, copy_gbps, SHAPES, verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
