"""Sweep the grouped (one-kernel-a-direction) path of batch_norm_act against its two-kernel path,
at ResNet-50's stage shapes (batch 256, bf16, channels_last, training, residual, ReLU).

    python benchmarks/kernels/tune_batch_norm_grouped.py [--shapes 256x1024x14x14] [--quick]

For every shape: the two-kernel path's forward and forward+backward (CUDA-graph replay: GPU time
alone) and, alternating with it (gpushape.bench.compare), every configuration of GroupedConfig
in CONFIGS, forced on whether or not its groups fit the L2 (so the sweep also shows where the
plans' L2 rule should say no). Each configuration is first checked against the two-kernel
result (y, dx, d_residual, dweight, dbias) and for bitwise repeatability. Also reports what the
plans choose by default ("auto"). Writes $OUT/tune_batch_norm_grouped.json (default ./out);
prints a table last: ms, GB/s counting the grouped path's own passes, speed-up over two-kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as common  # first: it puts this working tree's src/ on the path

from gpushape.bench import compare, write_results
from gpushape.kernels import _batch_norm_launch as launch
from gpushape.kernels import batch_norm_act
from gpushape.kernels._batch_norm_tuning import GroupedConfig, batch_norm_tuning

SHAPES = [(256, 1024, 14, 14), (256, 512, 28, 28), (256, 256, 56, 56), (256, 64, 112, 112)]
BASE = GroupedConfig(force=True)
CONFIGS = {
    "base": BASE,
    "pps2": dataclasses.replace(BASE, programs_per_sm=2),
    "l64": dataclasses.replace(BASE, block_l=64),
    "l64_pps2": dataclasses.replace(BASE, block_l=64, programs_per_sm=2),
    "c128": dataclasses.replace(BASE, block_c=128),
    "c128_l16": dataclasses.replace(BASE, block_c=128, block_l=16),
    "c32": dataclasses.replace(BASE, block_c=32),
    "w8_l64": dataclasses.replace(BASE, warps=8, block_l=64),
    "lag0": dataclasses.replace(BASE, lag=0),
    "lag2": dataclasses.replace(BASE, lag=2),
    "team8": dataclasses.replace(BASE, team=8),
    "team128": dataclasses.replace(BASE, team=128),
}
QUICK = ("base", "l64", "c128", "lag2", "team8")
# Passes over one tensor each path moves (ReLU mask bits: 1/16 of a pass each way).
PASSES = {"two-kernel": {"fwd": 4 + 1 / 16, "fwd+bwd": 10 + 3 / 16},
          "grouped": {"fwd": 3 + 1 / 16, "fwd+bwd": 7 + 1 / 8}}


def _inputs(shape, device):
    c = shape[1]
    x = (0.5 * torch.randn(shape, device=device) - 1.0).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    r, dy = torch.randn_like(x), torch.randn_like(x)
    w = (1 + 0.2 * torch.randn(c, device=device)).requires_grad_()
    b = (0.1 * torch.randn(c, device=device)).requires_grad_()
    return x.requires_grad_(), r.requires_grad_(), dy, w, b


def _jobs(x, r, dy, w, b):
    def fwd():
        return batch_norm_act(x, w, b, None, None, True, residual=r)

    def fwd_bwd():
        return torch.autograd.grad(fwd(), (x, r, w, b), dy)
    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _results(x, r, dy, w, b):
    y = batch_norm_act(x, w, b, None, None, True, residual=r)
    return (y.detach(), *torch.autograd.grad(y, (x, r, w, b), dy))


OUTPUTS = ("y", "dx", "dres", "dweight", "dbias")


def _check(got, expected) -> dict:
    """|difference| over each of the five results, relative to its scale: the largest, and
    how many elements differ by more than 5% of the scale."""
    errors = {}
    for name, g, e in zip(OUTPUTS, got, expected):
        scale = e.float().abs().max().clamp_min(1e-6)
        diff = (g.float() - e.float()).abs() / scale
        errors[name] = dict(max=diff.max().item(), over_5pct=int((diff > 0.05).sum().item()))
    return errors


def _graphs(jobs, device):
    return {k: common.graphed(fn, device) for k, fn in jobs.items()}


def sweep_shape(shape, names, device, rounds) -> list[dict]:
    x, r, dy, w, b = _inputs(shape, device)
    numel = x.numel() * x.element_size()
    with batch_norm_tuning(grouped=GroupedConfig(enabled=False)):
        expected = _results(x, r, dy, w, b)
        two = _graphs(_jobs(x, r, dy, w, b), device)
    auto = launch.grouped_forward_plan(x, w, b, None, r, True)
    auto_bwd = launch.backward_plan(x, w, expected[4], True, True, True).grouped
    rows = []
    print(f"{'x'.join(map(str, shape))}: auto = fwd {auto and auto.block_c}, "
          f"bwd {auto_bwd and auto_bwd.block_c} channels a group", flush=True)
    for name in names:
        cfg = CONFIGS[name]
        try:
            with batch_norm_tuning(grouped=cfg):
                got = _results(x, r, dy, w, b)
                again = _results(x, r, dy, w, b)
                graphs = _graphs(_jobs(x, r, dy, w, b), device)
        except Exception as exc:  # a configuration that cannot run is reported, not fatal
            print(f"  {name}: failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            rows.append(dict(shape=list(shape), config=name, error=str(exc)[:300]))
            continue
        errors = _check(got, expected)
        err = max(v["max"] for v in errors.values())
        bitwise = all(torch.equal(a, c) for a, c in zip(got, again))
        row = dict(shape=list(shape), config=name, grouped=dataclasses.asdict(cfg),
                   rel_err_vs_two_kernel=err, errors=errors, bitwise_repeat=bitwise)
        for job in ("fwd", "fwd+bwd"):
            t = compare({"two-kernel": two[job], "grouped": graphs[job]}, rounds=rounds,
                        repeats_per_round=10)
            for path in ("two-kernel", "grouped"):
                row[f"{job} {path} ms"] = t[path].median_s * 1e3
                row[f"{job} {path} GB/s"] = PASSES[path][job] * numel / t[path].median_s / 1e9
            row[f"{job} speedup"] = t["two-kernel"].median_s / t["grouped"].median_s
        rows.append(row)
        print(f"  {name:9s} err {err:.1e} bitwise {bitwise}  fwd {row['fwd grouped ms']:.3f} "
              f"(two {row['fwd two-kernel ms']:.3f})  fwd+bwd {row['fwd+bwd grouped ms']:.3f} "
              f"(two {row['fwd+bwd two-kernel ms']:.3f}) x{row['fwd+bwd speedup']:.2f}",
              flush=True)
        if err > 0.05:
            print(f"    errors: {errors}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=common.parse_shapes, default=SHAPES)
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--configs", default="", help="comma-separated names of CONFIGS")
    common.add_device_arg(parser)
    args = parser.parse_args()
    if common.cuda_missing(args.device, "tune_batch_norm_grouped.py"):
        sys.exit(2)
    names = args.configs.split(",") if args.configs else list(QUICK if args.quick else CONFIGS)
    copy_gbps = common.measure_copy_gbps(args.device)
    rows = []
    for shape in args.shapes:
        rows += sweep_shape(shape, names, args.device, rounds=3 if args.quick else 5)
    out = Path(os.environ.get("OUT", "out"))
    write_results(out / "tune_batch_norm_grouped.json", dict(copy_gbps=copy_gbps, rows=rows),
                  command=" ".join(sys.argv))
    print(f"\ncopy {copy_gbps:.0f} GB/s; fwd+bwd from CUDA graphs (ms), grouped vs two-kernel")
    print(f"{'shape':>18} {'config':>9} {'two':>7} {'grouped':>8} {'x':>5} {'GB/s':>6} {'err':>8}")
    for row in rows:
        if "error" in row:
            continue
        print(f"{'x'.join(map(str, row['shape'])):>18} {row['config']:>9} "
              f"{row['fwd+bwd two-kernel ms']:7.3f} {row['fwd+bwd grouped ms']:8.3f} "
              f"{row['fwd+bwd speedup']:5.2f} {row['fwd+bwd grouped GB/s']:6.0f} "
              f"{row['rel_err_vs_two_kernel']:8.1e}")


if __name__ == "__main__":
    main()
