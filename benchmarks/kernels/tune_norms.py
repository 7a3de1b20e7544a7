"""Sweep the row-norm kernels' launch configurations on one GPU, forward and backward apart.

    python benchmarks/kernels/tune_norms.py [--quick] [--ops layer_norm_gelu,rms_norm]
                                            [--shapes 32768x4096,...] [--budget-s 170]

For layer_norm_gelu and rms_norm at each shape, every candidate configuration (FwdConfig /
BwdConfig of src/gpushape/kernels/_norm_tuning.py: rows per tile, warps, programs per SM,
prefetch depth, weight reload, looped column blocks) is
1. checked: y (forward) and dx, dweight, dbias (backward op on the saved tensors) against a
   float32 PyTorch reference (bf16 tolerances, atol = rtol = 2e-2; dweight/dbias relative);
2. timed as GPU time: the op (forward custom op under no_grad; backward custom op on saved
   tensors, including the dweight/dbias partial sum) captured CALLS times in one CUDA graph, so
   host overhead does not enter; the default configuration and the candidate alternate round by
   round (gpushape.bench.compare, CUDA events, medians);
3. reported as GB/s of minimum bytes (forward: read x, write y = 2 S; backward: read x, dy,
   write dx = 3 S; S = one (M, N) bf16 tensor) and as % of the copy bandwidth measured in the
   same run.
Host overhead per call (no graph, no sync: Python + dispatch + launches) is measured for the
default configuration, forward op, backward op and the whole autograd forward+backward.
Writes $OUT/tune_norms.json (default ./out); prints the best configuration per op, shape and
direction, and TableEntry lines to paste into _norm_tuning.TABLE.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench_common as common  # noqa: E402
from tune_norms_grid import bwd_grid, fwd_grid, table_lines  # noqa: E402

import gpushape.kernels  # noqa: E402, F401  (registers the gpushape:: custom ops)
from gpushape.bench import compare, copy_bandwidth_bytes_per_s, write_results  # noqa: E402
from gpushape.kernels.norms._tuning import (  # noqa: E402
    bwd_config,
    fwd_config,
    norm_tuning,
    tuning,
)

SHAPES = [(32768, 4096), (262144, 768), (8192, 8192), (4096, 16384)]
DTYPE = torch.bfloat16
CALLS = 10  # op calls per CUDA graph replay
WIDE = dict(fwd_max_block_n=1 << 20, bwd_max_block_n=1 << 20)  # forced configs apply at any N


class Op:
    """One op's forward and backward custom ops, with inputs and a float32 reference."""

    def __init__(self, name: str, m: int, n: int, device: str):
        self.name, self.m, self.n = name, m, n
        g = torch.Generator(device=device).manual_seed(0)
        self.x = (0.5 * torch.randn(m, n, device=device, generator=g) - 1.0).to(DTYPE)
        self.dy = torch.randn(m, n, device=device, generator=g).to(DTYPE)
        self.w = torch.randn(n, device=device, generator=g).to(DTYPE)
        self.b = torch.randn(n, device=device, generator=g).to(DTYPE) if self.ln else None
        with torch.no_grad():
            self.saved = self.forward()[1:]  # (mean, rstd) or (rstd,)
        self.ref = self._reference()

    @property
    def ln(self) -> bool:
        return self.name == "layer_norm_gelu"

    def forward(self):
        if self.ln:
            return torch.ops.gpushape.layer_norm_gelu(self.x, self.w, self.b, 1e-5, "none")
        return torch.ops.gpushape.rms_norm(self.x, self.w, 1e-6)

    def backward(self):
        if self.ln:
            return torch.ops.gpushape.layer_norm_gelu_backward(
                self.dy, self.x, self.w, self.b, *self.saved, "none"
            )
        return torch.ops.gpushape.rms_norm_backward(self.dy, self.x, self.w, *self.saved)

    def _reference(self) -> dict[str, torch.Tensor]:
        import torch.nn.functional as F

        leaves = [t.float().requires_grad_() for t in (self.x, self.w, self.b) if t is not None]
        x, w = leaves[0], leaves[1]
        if self.ln:
            y = F.gelu(F.layer_norm(x, (self.n,), w, leaves[2], 1e-5))
        else:
            y = F.rms_norm(x, (self.n,), w, 1e-6)
        grads = torch.autograd.grad(y, leaves, self.dy.float())
        return dict(zip(["y", "dx", "dw", "db"], [y.detach(), *grads]))

    def check(self, direction: str) -> str | None:
        """None when the current configuration matches the reference, else what differs."""
        with torch.no_grad():
            got = (
                {"y": self.forward()[0]}
                if direction == "fwd"
                else dict(zip(["dx", "dw", "db"], self.backward()))
            )
        for key, value in got.items():
            if value.numel() == 0:
                continue
            ref = self.ref[key]
            scale = 1.0 if key in ("y", "dx") else float(ref.abs().max()) + 1e-6
            err = float((value.float() - ref).abs().max()) / scale
            tol = 2e-2 + 2e-2 * (float(ref.abs().max()) if key in ("y", "dx") else 1.0)
            if not err <= tol:  # NaN fails too
                return f"{key}: max error {err:.3g} > {tol:.3g}"
        return None


def graph_of(fn, calls: int):
    """fn captured `calls` times in one CUDA graph; returns its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        fn()  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        for _ in range(calls):
            fn()
    return graph.replay


def host_us(fn, calls: int = 50) -> float:
    """Host time per call, queued without synchronising (what a training step's CPU pays)."""
    return common.host_and_wall_us(fn, calls)[0]


def sweep_direction(
    op: Op, direction: str, configs: list, rounds: int, repeats: int, deadline: float
) -> list[dict]:
    fn = op.forward if direction == "fwd" else op.backward
    key = "fwd" if direction == "fwd" else "bwd"
    passes = 2 if direction == "fwd" else 3
    min_bytes = passes * op.m * op.n * DTYPE.itemsize
    default_cfg = (fwd_config if key == "fwd" else bwd_config)(op.m, op.n, tuning())
    default = graph_of(fn, CALLS)
    rows = []
    for cfg in configs:
        if time.perf_counter() > deadline:
            print(f"  budget spent: {len(configs) - len(rows)} {direction} configs not run")
            break
        row = dict(
            op=op.name,
            shape=[op.m, op.n],
            direction=direction,
            config=repr(cfg),
            is_default=cfg == default_cfg,
            min_bytes=min_bytes,
        )
        try:
            with norm_tuning(**WIDE, **{key: cfg}):
                row["check"] = op.check(direction) or "pass"
                candidate = graph_of(fn, CALLS) if row["check"] == "pass" else None
        except Exception as exc:  # e.g. out of registers / shared memory at launch
            row["check"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            candidate = None
        if candidate is not None:
            t = compare(
                {"default": default, "candidate": candidate},
                rounds=rounds,
                repeats_per_round=repeats,
                warmup=1,
                device="cuda",
            )
            row["ms"] = t["candidate"].median_s / CALLS * 1e3
            row["default_ms"] = t["default"].median_s / CALLS * 1e3
            row["gbps"] = min_bytes / (row["ms"] / 1e3) / 1e9
        rows.append(row)
        print(
            f"  {direction:3s} {cfg!r:96s} "
            + (
                f"{row['ms']:.4f} ms {row['gbps']:6.0f} GB/s (default {row['default_ms']:.4f})"
                if "ms" in row
                else row["check"]
            ),
            flush=True,
        )
    return rows


def default_costs(op: Op) -> dict:
    """Host time per call and GPU time of the default configuration."""

    def fwd_bwd():
        x = op.x.detach().requires_grad_()
        args = (x, op.w, op.b, 1e-5, "none") if op.ln else (x, op.w, 1e-6)
        op_fn = torch.ops.gpushape.layer_norm_gelu if op.ln else torch.ops.gpushape.rms_norm
        torch.autograd.grad(op_fn(*args)[0], x, op.dy)

    def fwd_nograd():
        with torch.no_grad():
            op.forward()

    return dict(
        op=op.name,
        shape=[op.m, op.n],
        default_fwd=repr(fwd_config(op.m, op.n, tuning())),
        default_bwd=repr(bwd_config(op.m, op.n, tuning())),
        host_us_fwd=host_us(fwd_nograd),
        host_us_bwd=host_us(op.backward),
        host_us_fwd_bwd_autograd=host_us(fwd_bwd),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and configurations")
    parser.add_argument("--ops", default="layer_norm_gelu,rms_norm")
    parser.add_argument("--shapes", default="", help="e.g. 32768x4096,8192x8192")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=170.0,
        help="stop starting new configurations after this many seconds",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: smoke test of the configurations' correctness only "
        "(TRITON_INTERPRET=1, tiny shapes; no timing)",
    )
    args = parser.parse_args(argv)
    shapes = (
        [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        if args.shapes
        else SHAPES
    )
    started = time.perf_counter()
    deadline = started + args.budget_s
    rounds, repeats = (2, 3) if args.quick else (3, 5)
    if args.device == "cpu":
        return smoke_test(args.ops.split(","), shapes, args.quick)
    if not torch.cuda.is_available():
        print("tune_norms: needs a CUDA GPU (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    copy_gbps = copy_bandwidth_bytes_per_s(2**30, device="cuda") / 1e9
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s", flush=True)
    rows, costs = [], []
    # Each (shape, op) gets an equal slice of the budget; grids list the likeliest configs first.
    slots = [(m, n, name) for m, n in shapes for name in args.ops.split(",")]
    slot_s = (deadline - time.perf_counter()) / len(slots)
    for i, (m, n, name) in enumerate(slots):
        # time a slot leaves unused passes to the next ones
        slot_end = deadline - (len(slots) - i - 1) * slot_s
        op = Op(name, m, n, "cuda")
        costs.append(default_costs(op))
        print(f"{name} {m}x{n}: host us/call {costs[-1]}", flush=True)
        # the forward may use the slice up to 40% before its end, the backward the rest
        rows += sweep_direction(
            op, "fwd", fwd_grid(m, n, args.quick), rounds, repeats, slot_end - 0.6 * slot_s
        )
        rows += sweep_direction(op, "bwd", bwd_grid(m, n, args.quick), rounds, repeats, slot_end)
        del op
        torch.cuda.empty_cache()
    for r in rows:
        if "gbps" in r:
            r["pct_copy"] = r["gbps"] / copy_gbps
    best = best_rows(rows)
    out_dir = Path(os.environ.get("OUT", "out"))
    path = write_results(
        out_dir / "tune_norms.json",
        rows,
        copy_bandwidth_gbps=copy_gbps,
        best=best,
        host_costs=costs,
        calls_per_graph=CALLS,
        timing=f"CUDA graph of {CALLS} calls, CUDA events, {rounds} alternating "
        f"rounds x {repeats} repeats vs the default config, median",
        bytes_counted="fwd 2 S (x, y), bwd 3 S (x, dy, dx), S = M*N*2 bytes",
    )
    print(f"wrote {path} ({time.perf_counter() - started:.0f} s)")
    print_best(best, costs, copy_gbps)
    return 0


def best_rows(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "ms" in r:
            groups.setdefault((r["op"], tuple(r["shape"]), r["direction"]), []).append(r)
    return [min(g, key=lambda r: r["ms"] / r["default_ms"]) for g in groups.values()]


def print_best(best: list[dict], costs: list[dict], copy_gbps: float) -> None:
    print(f"\ncopy {copy_gbps:.0f} GB/s; GPU ms per call (graph), GB/s of minimum bytes")
    print(f"{'op':16s} {'shape':>11s} dir  default_ms best_ms  GB/s  %copy  config")
    for r in best:
        print(
            f"{r['op']:16s} {r['shape'][0]:>5d}x{r['shape'][1]:<5d} {r['direction']:3s} "
            f"{r['default_ms']:10.4f} {r['ms']:7.4f} {r['gbps']:5.0f} {r['pct_copy']:6.0%}  "
            f"{r['config']}"
        )
    for c in costs:
        print(
            f"host us/call {c['op']} {c['shape']}: fwd {c['host_us_fwd']:.0f}, bwd op "
            f"{c['host_us_bwd']:.0f}, autograd fwd+bwd {c['host_us_fwd_bwd_autograd']:.0f}"
        )
    print("\n# paste into _norm_tuning.TABLE (winners of the first op listed per shape):")
    for line in table_lines(best):
        print(line)


def smoke_test(ops: list[str], shapes: list[tuple[int, int]], quick: bool) -> int:
    """CPU: every configuration of the grid computes the right result (interpreter)."""
    failures = 0
    for m, n in shapes:
        for name in ops:
            op = Op(name, m, n, "cpu")
            for direction, grid in (("fwd", fwd_grid), ("bwd", bwd_grid)):
                key = "fwd" if direction == "fwd" else "bwd"
                for cfg in grid(m, n, quick):
                    with norm_tuning(**WIDE, **{key: cfg}):
                        problem = op.check(direction)
                    failures += problem is not None
                    print(f"{name} {m}x{n} {direction} {cfg!r}: {problem or 'pass'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
