"""Search space, per-kernel runners and a parallel compile pool for tune_batch_norm_act.py.

Each of the four batch_norm_act kernels is tuned alone: a runner times one kernel (its plan
built under a BatchNormTuning that differs from the defaults in that kernel's configuration
only). Compiling is what costs: Triton compiles a kernel variant in about a second, and the
grid holds a few hundred variants, so a pool of worker processes compiles them first (each
builds the same plans on uninitialised tensors of the real shape and launches once), filling
Triton's on-disk cache; the timing process then only loads them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.kernels.batch_norm import _launch as launch  # noqa: E402
from gpushape.kernels.batch_norm._tuning import (  # noqa: E402
    DEFAULT,
    KINDS,
    ApplyConfig,
    BatchNormTuning,
    ReduceConfig,
    batch_norm_tuning,
)

EPS, MOMENTUM = 1e-5, 0.1
DTYPE = torch.bfloat16
DEVICE = "cuda"  # "cpu": smoke-test under TRITON_INTERPRET=1 (tune_batch_norm_act.py --device)
# the backward with its gradient in two parts, as ResNet's block outputs take it (a residual
# gradient handed over: kernels/batch_norm/_ops.py); tune_batch_norm_act.py --handover
HANDOVER = False
REDUCTIONS = ("stats", "bwd_reduce")
BLOCK_C = (64, 128, 256, 512, 1024)  # narrower: row segments of 64 bytes or less


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def stage1(kind: str, c: int, quick: bool) -> list:
    """The coarse grid of one kernel at C = c: channel block x tile x warps (defaults first)."""
    widths = [b for b in BLOCK_C if b <= max(_pow2(c), BLOCK_C[0])]
    if quick:
        widths = sorted({min(128, widths[-1]), widths[-1]})
    default = getattr(DEFAULT, kind)
    if kind in REDUCTIONS:
        tiles = (2048, 4096) if quick else (2048, 4096, 8192)
        grid = [
            ReduceConfig(block_c=b, tile_bytes=t, warps=w)
            for b in widths
            for t in tiles
            for w in (4, 8)
        ]
    else:  # (tile, warps) with 8 to 64 elements of a tensor a thread (bf16)
        pairs = (
            ((8192, 4), (8192, 8), (16384, 8), (32768, 8))
            if quick
            else (
                (8192, 4),
                (8192, 8),
                (8192, 16),
                (16384, 4),
                (16384, 8),
                (16384, 16),
                (32768, 8),
                (32768, 16),
            )
        )
        grid = [ApplyConfig(block_c=b, tile_bytes=t, warps=w) for b in widths for t, w in pairs]
    return [default] + [g for g in grid if g != default]


def stage2(kind: str, best: list) -> list:
    """Variants of the best stage-1 configurations: grid size, finalize, looping programs."""
    out = []
    for cfg in best:
        if kind in REDUCTIONS:
            out += [
                dataclasses.replace(cfg, waves=2),
                dataclasses.replace(cfg, waves=4),
                dataclasses.replace(cfg, min_rows=64),
                dataclasses.replace(cfg, fuse_max=0),
                dataclasses.replace(cfg, min_rows=64, waves=2),
            ]
        else:
            out += [
                dataclasses.replace(cfg, waves=w, prefetch=p)
                for w in (1, 2, 4)
                for p in (False, True)
            ]
    return list(dict.fromkeys(out))


def tuning_with(kind: str, cfg) -> BatchNormTuning:
    return dataclasses.replace(DEFAULT, **{kind: cfg})


def config_from(kind: str, d: dict):
    return KINDS[kind](**d)


@dataclasses.dataclass
class Buffers:
    """One shape's tensors: inputs, statistics, mask bits, gradients (bf16 channels_last)."""

    x: torch.Tensor
    r: torch.Tensor
    dy: torch.Tensor
    dy2: torch.Tensor  # the gradient's second part (HANDOVER)
    w: torch.Tensor
    b: torch.Tensor
    rm: torch.Tensor
    rv: torch.Tensor
    mean: torch.Tensor
    rstd: torch.Tensor
    bits: torch.Tensor
    dw: torch.Tensor
    db: torch.Tensor
    dx: torch.Tensor
    dres: torch.Tensor

    @staticmethod
    def make(shape, fill: bool) -> Buffers:
        """fill: random inputs and the statistics, bits and sums they give (default tuning);
        else uninitialised memory (enough to compile and launch)."""
        n, c, h, w = shape
        new = torch.randn if fill else torch.empty

        def act():
            return new(shape, device=DEVICE, dtype=DTYPE).contiguous(
                memory_format=torch.channels_last
            )

        x, r, dy, dy2 = act(), act(), act(), act()
        stat = dict(device=DEVICE, dtype=torch.float32)
        bufs = Buffers(
            x,
            r,
            dy,
            dy2,
            1 + 0.2 * torch.randn(c, **stat),
            0.2 * torch.randn(c, **stat),
            torch.zeros(c, **stat),
            torch.ones(c, **stat),
            torch.empty(c, **stat),
            torch.empty(c, **stat),
            torch.empty((n * h * w, (c + 7) // 8), device=DEVICE, dtype=torch.uint8),
            torch.empty(c, **stat),
            torch.empty(c, **stat),
            torch.empty_like(x),
            torch.empty_like(x),
        )
        if fill:
            plan = launch.forward_plan(x, bufs.w, bufs.b, bufs.rm, bufs.rv, r, True, True)
            bufs.mean, bufs.rstd = plan.stats(x, bufs.rm, bufs.rv, MOMENTUM, EPS)
            _, bufs.bits = plan.apply(x, bufs.mean, bufs.rstd, bufs.w, bufs.b, r, EPS)
            bplan = launch.backward_plan(x, bufs.w, bufs.rstd, True, True, True, HANDOVER)
            bufs.dw, bufs.db = _sums(bplan, bufs)
        return bufs


def _sums(plan, s: Buffers):
    """The backward's reduction (with HANDOVER: both parts read, dz written to dres)."""
    dy2, dz = (s.dy2, s.dres) if HANDOVER else (s.dy, s.dx)
    return plan.sums(True, s.dy, dy2, s.x, s.w, s.mean, s.rstd, s.bits, EPS, s.dx, s.dres, dz)


def runner(kind: str, bufs: Buffers, tuning: BatchNormTuning):
    """A no-argument function that runs one kernel (with its buffers) under `tuning`."""
    s = bufs
    with batch_norm_tuning(tuning):
        if kind in ("stats", "apply"):
            plan = launch.forward_plan(s.x, s.w, s.b, s.rm, s.rv, s.r, True, True)
        else:
            plan = launch.backward_plan(s.x, s.w, s.rstd, True, True, True, HANDOVER)
    if kind == "stats":
        return lambda: plan.stats(s.x, s.rm, s.rv, MOMENTUM, EPS)
    if kind == "apply":
        return lambda: plan.apply(s.x, s.mean, s.rstd, s.w, s.b, s.r, EPS)
    if kind == "bwd_reduce":
        return lambda: _sums(plan, s)
    if HANDOVER:  # dz (in dres) and x in, dx out: no mask, no residual gradient
        return lambda: plan.grads(
            True, s.dres, s.x, s.w, s.mean, s.rstd, s.bits, s.dw, s.db, s.dx, s.dx
        )
    return lambda: plan.grads(
        True, s.dy, s.x, s.w, s.mean, s.rstd, s.bits, s.dw, s.db, s.dx, s.dres
    )


def kernel_bytes(kind: str, shape) -> int:
    """Bytes a kernel moves at least: S = one bf16 tensor, mask bits S/16."""
    s = torch.Size(shape).numel() * 2
    bits = s // 16
    if HANDOVER and kind in ("bwd_reduce", "bwd_apply"):  # read dy, dy2, x, bits; write dz
        return {"bwd_reduce": 4 * s + bits, "bwd_apply": 3 * s}[kind]
    return {
        "stats": s,
        "apply": 3 * s + bits,
        "bwd_reduce": 2 * s + bits,
        "bwd_apply": 4 * s + bits,
    }[kind]


# ---- the compile pool ----

_BUFFERS: dict[tuple, Buffers] = {}


def job(shape, kind: str, cfg) -> tuple:
    """A compile job: (shape, kind, the config's fields as sorted (name, value) pairs, device,
    hand-over)."""
    fields = tuple(sorted(dataclasses.asdict(cfg).items()))
    return (tuple(shape), kind, fields, DEVICE, HANDOVER)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def compile_one(job: tuple) -> str | None:
    """Build one job's plan and launch it once (in a pool worker); None, or the error."""
    shape, kind, fields, device, handover = job
    global DEVICE, HANDOVER
    DEVICE, HANDOVER = device, handover
    try:
        if shape not in _BUFFERS:
            _BUFFERS.clear()
            empty_cache()
            _BUFFERS[shape] = Buffers.make(shape, fill=False)
        runner(kind, _BUFFERS[shape], tuning_with(kind, config_from(kind, dict(fields))))()
        sync()
        return None
    except Exception as exc:  # reported by the timing process, which skips the config
        return f"{type(exc).__name__}: {exc}"


def default_workers() -> int:
    return max(1, min(12, (os.cpu_count() or 2) - 2))
