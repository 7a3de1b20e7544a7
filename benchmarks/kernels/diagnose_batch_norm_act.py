"""Stage-by-stage error of batch_norm_act's kernels on the GPU, per launch configuration.

Each stage is checked against float64 computed from *our own* previous stage's outputs, so a
wrong stage shows up alone: statistics (mean, rstd), the fused forward (y, mask bits), the
backward reduction (dweight, dbias) and the backward elementwise pass (dx, d_residual).
Repeats catch intermittent faults (races); the worst element's (n, c, h, w) is printed.

    python benchmarks/kernels/diagnose_batch_norm_act.py [--repeats 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.kernels.batch_norm import _launch as launch
from gpushape.kernels.batch_norm._reference import unpack_bits_ref as _unpack_bits_ref
from gpushape.kernels.batch_norm._tuning import (
    DEFAULT,
    ApplyConfig,
    ReduceConfig,
    batch_norm_tuning,
)

CH = (1, -1, 1, 1)
SHAPES = [
    ((8, 64, 56, 56), "nchw"),
    ((4, 63, 9, 11), "cl"),
    ((4, 65, 9, 11), "nchw"),
    ((4, 65, 9, 11), "cl"),
    ((16, 256, 14, 14), "nchw"),
    ((32, 2048, 7, 7), "cl"),
    ((8, 64, 56, 56), "cl"),
]
CONFIGS = {
    "default": DEFAULT,
    "unfused": DEFAULT.__class__(
        stats=ReduceConfig(fuse_max=0), bwd_reduce=ReduceConfig(fuse_max=0)
    ),
    "bwd_apply_loop": DEFAULT.__class__(bwd_apply=ApplyConfig(waves=1, prefetch=True)),
    "small_tiles": DEFAULT.__class__(
        stats=ReduceConfig(tile_bytes=1024),
        bwd_reduce=ReduceConfig(tile_bytes=1024),
        apply=ApplyConfig(tile_bytes=2048),
        bwd_apply=ApplyConfig(tile_bytes=2048),
    ),
    "warps8": DEFAULT.__class__(stats=ReduceConfig(warps=8), bwd_reduce=ReduceConfig(warps=8)),
}


def rel(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """(max |a - b| / max(|b|max, 1e-30), flat index of the worst element)."""
    d = (a.double() - b.double()).abs()
    i = int(d.argmax()) if d.numel() else 0
    return float(d.max() / b.double().abs().max().clamp_min(1e-30)) if d.numel() else 0.0, i


def one(shape, fmt, dtype, gen, dev, tol):
    mf = torch.channels_last if fmt == "cl" else torch.contiguous_format
    x = (torch.randn(shape, generator=gen, device=dev) - 2.3).to(dtype).contiguous(memory_format=mf)
    r = torch.randn(shape, generator=gen, device=dev).to(dtype).contiguous(memory_format=mf)
    dy = torch.randn(shape, generator=gen, device=dev).to(dtype).contiguous(memory_format=mf)
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, generator=gen, device=dev)).to(dtype)
    b = (0.1 * torch.randn(c, generator=gen, device=dev)).to(dtype)
    eps = 1e-5
    out = {}
    mean, rstd = launch.batch_stats(x, None, None, 0.1, eps)
    var64, mean64 = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    out["mean"] = rel(mean, mean64)
    out["rstd"] = rel(rstd, torch.rsqrt(var64 + eps))
    y, bits = launch.apply(x, mean, rstd, w, b, r, eps, False, True)
    y64 = (
        (x.double() - mean.double().view(CH)) * (rstd.double() * w.double()).view(CH)
        + b.double().view(CH)
        + r.double()
    ).clamp_min(0)
    out["y"] = rel(y, y64)
    pos = _unpack_bits_ref(bits, x.shape)
    out["bits_wrong"] = (int((pos != (y > 0)).sum()), 0)
    dx, dw, db, dres = launch.backward(dy, x, w, mean, rstd, bits, eps, True, True, True)
    dz = torch.where(pos, dy.double(), 0.0)
    xmu = x.double() - mean.double().view(CH)
    out["db"] = rel(db, dz.sum((0, 2, 3)))
    out["dw"] = rel(dw, (dz * xmu).sum((0, 2, 3)) * rstd.double())
    out["dres"] = rel(dres, dz)
    n = x.numel() // c
    r64 = rstd.double()
    dx64 = (r64 * w.double()).view(CH) * (
        dz - (db.double() / n).view(CH) - xmu * (r64 * dw.double() / n).view(CH)
    )
    out["dx"] = rel(dx, dx64)
    # where is the worst dx element, and how many are off by more than tol relative?
    d = (dx.double() - dx64).abs() / dx64.abs().max()
    out["dx_bad_count"] = (int((d > tol).sum()), 0)
    i = out["dx"][1]
    # flat index over the logical (n, c, h, w) order of the contiguous view
    idx = torch.unravel_index(torch.tensor(i), shape)
    out["dx_worst_at"] = ([int(v) for v in idx], 0)
    bad = d > tol
    if bad.any():
        out["dx_bad_channels"] = (sorted({int(v) for v in bad.nonzero()[:, 1].tolist()})[:16], 0)
        out["dx_bad_n"] = (sorted({int(v) for v in bad.nonzero()[:, 0].tolist()})[:16], 0)
    if dev == "cuda":
        torch.cuda.synchronize()
    return {k: v[0] for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run in the Triton interpreter")
    args = ap.parse_args()
    gen = torch.Generator(device=args.device).manual_seed(0)
    shapes = SHAPES if args.device == "cuda" else [((2, 9, 5, 7), "nchw"), ((2, 9, 5, 7), "cl")]
    results = []
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
    for cname, cfg in CONFIGS.items():
        with batch_norm_tuning(cfg):
            for shape, fmt in shapes:
                for dtype in (torch.float32, torch.bfloat16):
                    worst: dict = {}
                    fails = 0
                    for _ in range(args.repeats):
                        res = one(shape, fmt, dtype, gen, args.device, tol[dtype])
                        bad = res["dx"] > tol[dtype] or res["dw"] > tol[dtype] or res["bits_wrong"]
                        fails += bool(bad)
                        for k, v in res.items():
                            if k not in worst or (isinstance(v, float | int) and v > worst[k]):
                                worst[k] = v
                    row = dict(
                        config=cname,
                        shape=list(shape),
                        fmt=fmt,
                        dtype=str(dtype),
                        fails=fails,
                        repeats=args.repeats,
                        **worst,
                    )
                    results.append(row)
                    print(
                        f"{cname:15s} {'x'.join(map(str, shape)):14s} {fmt:4s} "
                        f"{str(dtype)[6:]:8s} fails {fails}/{args.repeats} "
                        + " ".join(
                            f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in worst.items()
                        ),
                        flush=True,
                    )
    if args.out:
        write_results(
            args.out,
            results,
            repeats=args.repeats,
            tolerance={"float32": 1e-4, "bfloat16": 3e-2},
            note="relative to max|reference|; each stage checked against float64 "
            "computed from our own previous stage's outputs",
        )


if __name__ == "__main__":
    main()
