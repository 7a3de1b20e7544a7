"""Benchmark the fused norms against eager PyTorch, torch.compile and Liger-Kernel, on one GPU.

    python benchmarks/kernels/bench_norms.py [--quick] [--ops layer_norm_gelu,rms_norm] [--sweep]

1. Checks every op on the GPU first (the numeric gate of TESTING.md, forward and every gradient).
2. Measures device copy bandwidth in the same run (gpushape.bench.copy_bandwidth_bytes_per_s).
3. Times eager / torch.compile (default mode) / Liger / gpushape, forward (under no_grad) and
   forward+backward (outputs, then torch.autograd.grad for every input: no .grad accumulation),
   alternating the variants round by round (gpushape.bench.compare, CUDA events, medians), bf16.
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
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.bench import (  # noqa: E402
    Timing,
    compare,
    copy_bandwidth_bytes_per_s,
    write_results,
)
from gpushape.kernels import add_layer_norm, layer_norm_gelu, rms_norm  # noqa: E402
from gpushape.kernels._norm_common import norm_tuning  # noqa: E402


def _load_gate() -> Callable:
    """The numeric gate of the tests (tests/kernels/_numeric.py): one rule for both. Loaded by
    path, so no other installed package named `tests` can stand in for it."""
    path = ROOT / "tests" / "kernels" / "_numeric.py"
    spec = importlib.util.spec_from_file_location("gpushape_tests_numeric", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.gate_forward_backward


gate_forward_backward = _load_gate()

SHAPES = [(32768, 4096), (262144, 768), (8192, 8192), (4096, 16384)]
MAIN_SHAPE = (32768, 4096)
DTYPE = torch.bfloat16
LIGER_ERRORS: dict[str, str] = {}  # op -> why Liger did not run
DEVICE = "cuda"  # --device cpu (with TRITON_INTERPRET=1 and tiny --shapes) smoke-tests the script
VARIANTS = ("eager", "compile", "liger", "gpushape")
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
    module = (LigerLayerNorm(n, eps=1e-5, bias=True) if kind == "ln"
              else LigerRMSNorm(n, eps=1e-6, in_place=False))  # in_place would overwrite dy
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
    "layer_norm_gelu": Op("layer_norm_gelu", 1, 2, 1, 2, 5, layer_norm_gelu, _torch_ln_gelu,
                          _liger_ln_gelu),
    "add_layer_norm": Op("add_layer_norm", 2, 2, 2, 4, 8, add_layer_norm, _torch_add_ln,
                         _liger_add_ln),
    "rms_norm": Op("rms_norm", 1, 1, 1, 2, 5, lambda x, w: rms_norm(x, w, 1e-6), _torch_rms,
                   _liger_rms),
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
    out = {"eager": (lambda: op.torch_fn(*inputs), inputs),
           "compile": (lambda: compiled(*inputs), inputs)}
    liger = op.liger(n)
    if liger is not None:
        module, fn = liger
        with torch.no_grad():  # same parameter values as the other variants
            for p, src in zip(module.parameters(), inputs[op.rows:]):
                p.copy_(src)
        grads_wrt = inputs[: op.rows] + list(module.parameters())[: op.params]
        try:  # a Liger that cannot run here (version skew, device) is reported, not fatal
            torch.autograd.grad(_as_list(fn(*inputs)), grads_wrt,
                                [torch.ones_like(t) for t in _as_list(fn(*inputs))])
            out["liger"] = (lambda: fn(*inputs), grads_wrt)
        except Exception as exc:
            LIGER_ERRORS[op.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"liger: not run for {op.name} ({LIGER_ERRORS[op.name]})")
    out["gpushape"] = (lambda: op.ours(*inputs), inputs)
    return out


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def timed_per_call(fns: dict[str, Callable[[], object]], rounds: int, repeats: int,
                   calls: int) -> dict[str, Timing]:
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

    timings = compare({name: batch(fn) for name, fn in fns.items()}, rounds=rounds,
                      repeats_per_round=repeats, warmup=1, device=DEVICE)
    return {name: dataclasses.replace(t, times_s=tuple(v / calls for v in t.times_s))
            for name, t in timings.items()}


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
    for direction, passes in (("fwd", op.fwd_passes), ("fwd+bwd", op.fwd_bwd_passes)):
        fns = {name: (fwd(fn) if direction == "fwd" else fwd_bwd(fn, wrt))
               for name, (fn, wrt) in variants.items()}
        for f in fns.values():  # compile and autotune outside the timed rounds
            for _ in range(3):
                f()
        timings = timed_per_call(fns, rounds, repeats, CALLS_PER_TIMING)
        for name, t in timings.items():
            rows.append(dict(op=op.name, shape=[m, n], direction=direction, variant=name,
                             median_ms=t.median_s * 1e3, p10_ms=t.p10_s * 1e3,
                             p90_ms=t.p90_s * 1e3, repeats=t.repeats, method=t.method,
                             min_bytes=passes * tensor_bytes,
                             gbps=passes * tensor_bytes / t.median_s / 1e9))
    return rows


def add_speedups(rows: list[dict]) -> None:
    """Each row gets `speedup_vs_<variant>` = that variant's median / this row's median."""
    by_key = {(r["op"], tuple(r["shape"]), r["direction"], r["variant"]): r for r in rows}
    for r in rows:
        for other in VARIANTS:
            base = by_key.get((r["op"], tuple(r["shape"]), r["direction"], other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def criteria(rows: list[dict], copy_gbps: float) -> list[dict]:
    """The issue's done-when targets, judged on this run's numbers."""
    ours = {(r["op"], tuple(r["shape"]), r["direction"]): r for r in rows
            if r["variant"] == "gpushape"}
    out = []

    def judge(name, key, value_fn, target, unit):
        row = ours.get(key)
        if row is None:
            return
        value = value_fn(row)
        if value is None:
            out.append(dict(criterion=name, value=None, target=target, verdict="not run"))
            return
        out.append(dict(criterion=name, value=value, target=target, unit=unit,
                        verdict="PASS" if value >= target else "FAIL"))

    pct = lambda r: r["gbps"] / copy_gbps
    vs = lambda other: lambda r: r.get(f"speedup_vs_{other}")
    m = MAIN_SHAPE
    judge("layer_norm_gelu fwd % of copy @32768x4096", ("layer_norm_gelu", m, "fwd"), pct,
          0.85, "fraction")
    for other, target in (("eager", 2.5), ("compile", 1.3), ("liger", 1.3)):
        judge(f"layer_norm_gelu fwd+bwd vs {other} @32768x4096",
              ("layer_norm_gelu", m, "fwd+bwd"), vs(other), target, "x")
    for op in ("add_layer_norm", "rms_norm"):
        judge(f"{op} fwd % of copy @32768x4096", (op, m, "fwd"), pct, 0.80, "fraction")
        judge(f"{op} fwd+bwd vs eager @32768x4096", (op, m, "fwd+bwd"), vs("eager"), 2.0, "x")
    for (op, shape, direction), _row in sorted(ours.items()):
        judge(f"{op} {direction} not slower than eager @{shape[0]}x{shape[1]}",
              (op, shape, direction), vs("eager"), 1.0, "x")
    return out


def plot(rows: list[dict], copy_gbps: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(len(ops), 2, figsize=(13, 3.6 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, direction in enumerate(("fwd", "fwd+bwd")):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and r["direction"] == direction]
            shapes = sorted({tuple(r["shape"]) for r in sel}, key=SHAPES.index)
            names = [v for v in VARIANTS if any(r["variant"] == v for r in sel)]
            width = 0.8 / max(1, len(names))
            for k, name in enumerate(names):
                vals = [next((r["gbps"] for r in sel if r["variant"] == name
                              and tuple(r["shape"]) == s), 0.0) for s in shapes]
                ax.bar([x + k * width for x in range(len(shapes))], vals, width, label=name)
            ax.axhline(copy_gbps, color="k", ls="--", lw=1, label="copy (same run)")
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))],
                          [f"{s[0]}x{s[1]}" for s in shapes])
            ax.set_title(f"{op} {direction}, bf16")
            ax.set_ylabel("GB/s (minimum bytes / median time)")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(rows: list[dict], copy_gbps: float, verdicts: list[dict]) -> None:
    print(f"\ncopy bandwidth (same run): {copy_gbps:.0f} GB/s; median ms by CUDA events; "
          f"GB/s and % copy are gpushape's, from minimum bytes (see --help)")
    head = (f"{'op':16s} {'shape':>11s} {'dir':7s}" + "".join(f"{v:>10s}" for v in VARIANTS)
            + f"{'GB/s':>7s}{'%copy':>7s}{'x eager':>9s}{'x comp':>8s}{'x liger':>9s}")
    print(head)
    keys = sorted({(r["op"], tuple(r["shape"]), r["direction"]) for r in rows},
                  key=lambda k: (k[0], SHAPES.index(k[1]), k[2]))
    for op, shape, direction in keys:
        sel = {r["variant"]: r for r in rows if (r["op"], tuple(r["shape"]), r["direction"])
               == (op, shape, direction)}
        ours = sel["gpushape"]
        ms = "".join(f"{sel[v]['median_ms']:10.3f}" if v in sel else f"{'n/a':>10s}"
                     for v in VARIANTS)
        ups = "".join(f"{ours.get(f'speedup_vs_{v}', float('nan')):{w}.2f}"
                      for v, w in (("eager", 9), ("compile", 8), ("liger", 9)))
        print(f"{op:16s} {shape[0]:>5d}x{shape[1]:<5d} {direction:7s}{ms}"
              f"{ours['gbps']:7.0f}{100 * ours['gbps'] / copy_gbps:6.0f}%{ups}")
    print()
    for v in verdicts:
        value = "n/a" if v["value"] is None else f"{v['value']:.3g}"
        print(f"{v['verdict']:8s} {v['criterion']}: {value} (target >= {v['target']:g})")


def sweep(rounds: int, repeats: int) -> list[dict]:
    """layer_norm_gelu under alternative launch heuristics, fwd and fwd+bwd, at every shape."""
    options = [dict(), dict(bwd_elems_per_thread=4), dict(bwd_elems_per_thread=16),
               dict(bwd_warps_per_sm=32), dict(bwd_warps_per_sm=8), dict(bwd_tile_elems=4096),
               dict(prefetch2_max_elems_per_thread=0), dict(fwd_tile_elems=8192),
               dict(fwd_tile_elems=2048), dict(fwd_elems_per_thread=8),
               dict(fwd_elems_per_thread=32), dict(fwd_tile_elems=8192, fwd_elems_per_thread=32),
               dict(fwd_max_block_n=8192), dict(bwd_max_block_n=4096)]
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
                t = timed_per_call({"fwd": fwd, "fwd+bwd": fwd_bwd}, rounds, repeats,
                                   CALLS_PER_TIMING)
            label = ",".join(f"{k}={v}" for k, v in changes.items()) or "defaults"
            out.append(dict(shape=[m, n], tuning=label, fwd_ms=t["fwd"].median_s * 1e3,
                            fwd_bwd_ms=t["fwd+bwd"].median_s * 1e3))
            print(f"sweep {m}x{n} {label:28s} fwd {out[-1]['fwd_ms']:.3f} ms  "
                  f"fwd+bwd {out[-1]['fwd_bwd_ms']:.3f} ms", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats; checks on slices")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of ops")
    parser.add_argument("--sweep", action="store_true",
                        help="also time layer_norm_gelu under alternative launch heuristics")
    parser.add_argument("--shapes", default="", help="e.g. 8192x4096,1024x768 (default: the "
                        "issue's four shapes)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu only to smoke-test this script (TRITON_INTERPRET=1, tiny shapes)")
    args = parser.parse_args(argv)
    global DEVICE, SHAPES
    DEVICE = args.device
    if args.shapes:
        SHAPES = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_norms: needs a CUDA GPU (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    ops = [OPS[name] for name in args.ops.split(",")]
    rounds, repeats = (3, 5) if args.quick else (5, 10)
    out_dir = Path(os.environ.get("OUT", "out"))
    torch.manual_seed(0)

    checks = {}
    for op in ops:  # correctness first, at every shape (row slices with --quick)
        for m, n in SHAPES:
            rows_checked = min(m, 4096) if args.quick else m
            checks[f"{op.name} {rows_checked}x{n}"] = check(op, rows_checked, n)
            print(f"check {op.name} {rows_checked}x{n}: {checks[f'{op.name} {rows_checked}x{n}']}",
                  flush=True)
    copy_gbps = copy_bandwidth_bytes_per_s(
        2**30 if DEVICE == "cuda" else 2**22, device=DEVICE) / 1e9
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s", flush=True)

    rows = []
    for op in ops:
        for m, n in SHAPES:
            rows += time_op(op, m, n, rounds, repeats)
            print(f"timed {op.name} {m}x{n}", flush=True)
            torch.cuda.empty_cache()
    add_speedups(rows)
    for r in rows:
        r["pct_copy"] = r["gbps"] / copy_gbps
    verdicts = criteria(rows, copy_gbps)
    swept = sweep(rounds, repeats) if args.sweep else None
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        liger = version("liger-kernel")
    except Exception as exc:
        liger = f"not run ({type(exc).__name__})"
    path = write_results(
        out_dir / "bench_norms.json", rows, copy_bandwidth_gbps=copy_gbps, dtype="bf16",
        liger_kernel=liger, liger_errors=LIGER_ERRORS, checks=checks, criteria=verdicts,
        sweep=swept,
        bytes_counted=("minimum bytes in units of one (M, N) bf16 tensor: layer_norm_gelu and "
                       "rms_norm fwd 2, fwd+bwd 5; add_layer_norm fwd 4, fwd+bwd 8"),
        timing=(f"CUDA events around {CALLS_PER_TIMING} back-to-back calls, divided by "
                f"{CALLS_PER_TIMING}; {rounds} alternating rounds x {repeats} repeats, median; "
                f"fwd under no_grad, fwd+bwd = outputs + torch.autograd.grad w.r.t. all inputs"))
    plot(rows, copy_gbps, out_dir / "bench_norms.png")
    print(f"wrote {path} and {out_dir / 'bench_norms.png'}")
    print_table(rows, copy_gbps, verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
