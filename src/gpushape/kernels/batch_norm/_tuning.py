"""Launch configurations of the batch_norm_act kernels: defaults, a per-shape table, overrides.

Four kernels run per training step, each with its own configuration:
  stats       reduction over x (forward statistics)          ReduceConfig
  apply       y = act(norm(x) + residual), mask bits          ApplyConfig
  bwd_reduce  reduction over dy, x, bits (dweight, dbias)     ReduceConfig
  bwd_apply   dx, d_residual                                  ApplyConfig

`TUNED` is data: (C, N*H*W) of a channels_last input -> the configuration that
benchmarks/kernels/tune_batch_norm_act.py measured fastest (that script prints entries in this
form, and writes them to its JSON, which `load_table` reads). A shape not in the table takes
the entry of the same C with the nearest N*H*W (log scale), else the defaults below. NCHW
inputs always take the defaults (their tiles run along H*W, not C).

GPUSHAPE_BATCH_NORM_TUNING names tune_batch_norm_act.py JSON files (separated by the OS path
separator) whose tables are added to TUNED when this module loads: tune on your own chip and
shapes, then run with the result, no code edited.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import GpushapeError


@dataclass(frozen=True, kw_only=True)
class ReduceConfig:
    """A grid-stride reduction: `tile_bytes` of one input a tile, two tiles in flight a trip,
    on `warps` warps; `block_c` channels a program (capped at C rounded up to a power of two);
    `waves` waves of resident programs, none with fewer than `min_rows` rows (each writes
    2 * block_c partial sums). The last program of a channel block adds the partials itself
    when there are at most `fuse_max` (P * block_c) of each kind; above it (or at 0) a separate
    finalize kernel does, spread over many programs."""

    block_c: int = 128
    tile_bytes: int = 4096
    warps: int = 4
    waves: int = 1
    min_rows: int = 256
    fuse_max: int = 1 << 16


@dataclass(frozen=True, kw_only=True)
class ApplyConfig:
    """An elementwise pass: tiles of `tile_bytes` (of one input), `block_c` channels wide
    (capped as above), on `warps` warps. waves = 0: one tile a program; waves = k: k waves of
    resident programs, each looping over tiles (its channel vectors fetched once), with the
    next tile's loads in flight while it computes this one when `prefetch` (two tiles live)."""

    block_c: int = 256
    tile_bytes: int = 16384
    warps: int = 8
    waves: int = 0
    prefetch: bool = False


@dataclass(frozen=True, kw_only=True)
class BatchNormTuning:
    """One configuration per kernel (see the module docstring)."""

    stats: ReduceConfig = ReduceConfig()
    apply: ApplyConfig = ApplyConfig()
    bwd_reduce: ReduceConfig = ReduceConfig()
    bwd_apply: ApplyConfig = ApplyConfig()


DEFAULT = BatchNormTuning()

# (C, N*H*W) -> tuning, channels_last. 1024 x 50176 (ResNet-50 stage 4, batch 256): H200
# sweep of 2026-11-30 (.notes/gpu2): 2 KiB reduction tiles (fwd 0.348 -> 0.266 ms, fwd+bwd
# 0.956 -> 0.878) and 32 KiB elementwise tiles (fwd+bwd 0.956 -> 0.875), each alone.
# Measured by tune_batch_norm_act.py --quick on an H200 (torch 2.11, triton 3.6, 2026-11-30;
# benchmarks/results/kernels-h200/tune_batch_norm_act.json): ResNet-50's stages at batch 256.
TUNED: dict[tuple[int, int], BatchNormTuning] = {
    (1024, 50176): BatchNormTuning(
        stats=ReduceConfig(min_rows=64),
        apply=ApplyConfig(block_c=1024, tile_bytes=8192),
        bwd_reduce=ReduceConfig(),
        bwd_apply=ApplyConfig(block_c=1024, tile_bytes=8192),
    ),
    (512, 200704): BatchNormTuning(
        stats=ReduceConfig(fuse_max=0),
        apply=ApplyConfig(block_c=512, tile_bytes=8192),
        bwd_reduce=ReduceConfig(),
        bwd_apply=ApplyConfig(block_c=512),
    ),
    (256, 802816): BatchNormTuning(
        stats=ReduceConfig(fuse_max=0),
        apply=ApplyConfig(tile_bytes=8192),
        bwd_reduce=ReduceConfig(fuse_max=0),
        bwd_apply=ApplyConfig(tile_bytes=8192, warps=4),
    ),
    (64, 3211264): BatchNormTuning(
        stats=ReduceConfig(block_c=64, fuse_max=0),
        apply=ApplyConfig(block_c=64, tile_bytes=8192, warps=4),
        bwd_reduce=ReduceConfig(block_c=64, fuse_max=0),
        bwd_apply=ApplyConfig(block_c=64, tile_bytes=8192, warps=4),
    ),
}

_OVERRIDE: BatchNormTuning | None = None
# Bumped whenever the answer of tuning_for may change: launch plans are cached per generation.
generation = 0


def tuning_for(c: int, rows: int, channels_last: bool) -> BatchNormTuning:
    """The configuration for an input with C = c and N*H*W = rows (see the module docstring)."""
    if _OVERRIDE is not None:
        return _OVERRIDE
    if not channels_last:
        return DEFAULT
    exact = TUNED.get((c, rows))
    if exact is not None:
        return exact
    same_c = [m for (k, m) in TUNED if k == c]
    if not same_c or rows <= 0:
        return DEFAULT
    nearest = min(same_c, key=lambda m: abs(math.log(m / rows)))
    return TUNED[(c, nearest)]


@contextlib.contextmanager
def batch_norm_tuning(tuning: BatchNormTuning | None = None, **changes):
    """Run the block with `tuning` (with `changes` to its fields) for every shape."""
    global _OVERRIDE, generation
    saved = _OVERRIDE
    _OVERRIDE = dataclasses.replace(tuning or DEFAULT, **changes)
    generation += 1
    try:
        yield _OVERRIDE
    finally:
        _OVERRIDE = saved
        generation += 1


KINDS = {
    "stats": ReduceConfig,
    "apply": ApplyConfig,
    "bwd_reduce": ReduceConfig,
    "bwd_apply": ApplyConfig,
}


def from_dict(d: dict) -> BatchNormTuning:
    """A BatchNormTuning from its dataclasses.asdict form."""
    return BatchNormTuning(**{k: KINDS[k](**v) for k, v in d.items()})


def load_table(path: str | Path) -> dict[tuple[int, int], BatchNormTuning]:
    """Install the `table` of a tune_batch_norm_act.py JSON into TUNED; returns what it added."""
    global generation
    entries = json.loads(Path(path).read_text())["table"]
    added = {(e["C"], e["rows"]): from_dict(e["tuning"]) for e in entries}
    TUNED.update(added)
    generation += 1
    return added


ENV_VAR = "GPUSHAPE_BATCH_NORM_TUNING"


class TuningTableError(GpushapeError, ValueError):
    """A tuning table named by GPUSHAPE_BATCH_NORM_TUNING that cannot be loaded."""


def load_env_tables(value: str | None = None) -> dict[tuple[int, int], BatchNormTuning]:
    """Load the tables GPUSHAPE_BATCH_NORM_TUNING names (or `value`); returns what they added.
    A missing or malformed file raises TuningTableError (a ValueError) naming the variable
    and the file."""
    value = os.environ.get(ENV_VAR, "") if value is None else value
    added: dict[tuple[int, int], BatchNormTuning] = {}
    for path in filter(None, value.split(os.pathsep)):
        try:
            added.update(load_table(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TuningTableError(
                f"{ENV_VAR}: cannot load a tuning table from {path!r} "
                f"({type(e).__name__}: {e}); it takes tune_batch_norm_act.py's JSON"
            ) from None
    return added


load_env_tables()
