"""Launch configuration of the row-norm kernels: data, keyed on the row width N and row count M.

`fwd_config(m, n)` / `bwd_config(m, n)` return the configuration a launch uses: the first entry of
the tuning's table whose (max_n, min_m) admits the shape, else a heuristic from register budgets.
benchmarks/kernels/tune_norms.py measures alternatives on a GPU and prints table entries to paste
into `TABLE` below; `norm_tuning(...)` changes any field for a block of code (tests, sweeps).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class FwdConfig:
    """Forward: BLOCK_M whole rows per program, num_warps warps; block_n > 0 walks each row in
    chunks of block_n instead (looped path, one row per program, second pass from L2)."""

    block_m: int
    num_warps: int
    block_n: int = 0


@dataclass(frozen=True, kw_only=True)
class BwdConfig:
    """Persistent single-block backward: programs_per_sm programs of num_warps warps per SM, each
    walking BLOCK_M-row tiles and keeping its own float32 dweight / dbias partial row. prefetch:
    how many tiles ahead x and dy are loaded (0: none; other resident programs hide latency)."""

    block_m: int
    num_warps: int
    programs_per_sm: int
    prefetch: int = 1
    reload_wb: bool = False  # read weight / bias every tile instead of holding them
    # > 0: columns in blocks of block_n (looped path: a row-sums kernel reads x, dy first, so
    # 5 passes instead of 3, but no whole row in registers; for rows too wide for them).
    block_n: int = 0


@dataclass(frozen=True, kw_only=True)
class TableEntry:
    block_n: int  # applies to rows whose width rounds up to this power of two
    min_m: int = 0  # and that number at least this many
    fwd: FwdConfig | None = None  # None: the heuristic
    bwd: BwdConfig | None = None


# Measured winners (tune_norms.py on an H200, torch 2.11, triton 3.6, 2026-11-30; bf16
# LayerNorm+GELU, graph-timed; benchmarks/results/kernels-h200/tune_norms.json), largest min_m
# first. One entry serves every norm op of that row width.
TABLE: tuple[TableEntry, ...] = (
    TableEntry(
        block_n=1024,
        fwd=FwdConfig(block_m=2, num_warps=2),
        bwd=BwdConfig(block_m=1, num_warps=2, programs_per_sm=8, prefetch=1),
    ),
    TableEntry(
        block_n=4096,
        fwd=FwdConfig(block_m=1, num_warps=4),
        bwd=BwdConfig(block_m=1, num_warps=8, programs_per_sm=2, prefetch=1, reload_wb=True),
    ),
    TableEntry(
        block_n=8192,
        fwd=FwdConfig(block_m=1, num_warps=8),
        bwd=BwdConfig(block_m=1, num_warps=16, programs_per_sm=1, prefetch=1, reload_wb=True),
    ),
    TableEntry(
        block_n=16384,
        fwd=FwdConfig(block_m=1, num_warps=4, block_n=4096),
        bwd=BwdConfig(block_m=1, num_warps=8, programs_per_sm=4, prefetch=1, block_n=2048),
    ),
)


@dataclass(frozen=True, kw_only=True)
class NormTuning:
    """Launch heuristics. Chosen from register budgets, not measured on every GPU: `table`
    overrides them per shape, and `fwd` / `bwd` (when set) override everything."""

    fwd_max_block_n: int = 16384  # widest row the forward holds in registers at once
    bwd_max_block_n: int = 8192  # the backward keeps x, dy, w, b and two accumulators live
    fwd_tile_elems: int = 4096  # rows are batched until a program moves at least this many
    bwd_tile_elems: int = 2048
    # Register tile per thread, which sets num_warps. Forward: 16 (two 16-byte bf16 loads, about
    # 48 registers). Backward: 8 keeps it near 85-100 registers on sm_90 (ptxas, no spills).
    fwd_elems_per_thread: int = 16
    bwd_elems_per_thread: int = 8
    max_warps: int = 16
    looped_block_n: int = 4096  # chunk width of the multi-block (looped) path
    # Persistent backward: warps per SM across its programs (programs = SMs * this / num_warps,
    # at least bwd_min_programs_per_sm), so wide rows still get several programs per SM whose
    # row reductions (barriers) overlap.
    bwd_warps_per_sm: int = 32
    bwd_min_programs_per_sm: int = 2
    # The backward loads two tiles ahead (not one) while a thread holds at most this many
    # elements (~8 more registers); 0 never does.
    prefetch2_max_elems_per_thread: int = 8
    bf16_fast_gelu: bool = True  # see _fast_gelu in _norm_common; False uses erf for bfloat16
    sum_block_n: int = 32  # column tile of the dweight / dbias partial sum (more programs)
    sum_block_p: int = 32
    table: tuple[TableEntry, ...] = TABLE
    fwd: FwdConfig | None = None  # forced for every single-block forward (sweeps)
    bwd: BwdConfig | None = None  # forced for every single-block backward (sweeps)


_TUNING = NormTuning()


def tuning() -> NormTuning:
    return _TUNING


@contextlib.contextmanager
def norm_tuning(**changes) -> Iterator[NormTuning]:
    """Temporarily change launch heuristics (tests use it to reach the looped path at small N)."""
    global _TUNING
    saved = _TUNING
    _TUNING = dataclasses.replace(saved, **changes)
    try:
        yield _TUNING
    finally:
        _TUNING = saved


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_warps_for(tile_elems: int, elems_per_thread: int, t: NormTuning) -> int:
    return max(1, min(t.max_warps, pow2(max(1, tile_elems // (32 * elems_per_thread)))))


def _entry(t: NormTuning, m: int, n: int) -> TableEntry | None:
    return next((e for e in t.table if pow2(n) == e.block_n and m >= e.min_m), None)


def _rows_per_tile(m: int, block_n: int, tile_elems: int) -> int:
    return max(1, min(tile_elems // block_n, pow2(max(m, 1))))


def fwd_config(m: int, n: int, t: NormTuning) -> FwdConfig:
    if t.fwd is not None:
        return t.fwd
    entry = _entry(t, m, n)
    if entry is not None and entry.fwd is not None:
        return entry.fwd
    block_m = _rows_per_tile(m, pow2(n), t.fwd_tile_elems)
    return FwdConfig(
        block_m=block_m, num_warps=num_warps_for(block_m * pow2(n), t.fwd_elems_per_thread, t)
    )


def bwd_config(m: int, n: int, t: NormTuning) -> BwdConfig:
    if t.bwd is not None:
        return t.bwd
    entry = _entry(t, m, n)
    if entry is not None and entry.bwd is not None:
        return entry.bwd
    block_m = _rows_per_tile(m, pow2(n), t.bwd_tile_elems)
    warps = num_warps_for(block_m * pow2(n), t.bwd_elems_per_thread, t)
    per_sm = max(t.bwd_min_programs_per_sm, t.bwd_warps_per_sm // warps)
    elems = max(1, block_m * pow2(n) // (32 * warps))
    prefetch = 2 if elems <= t.prefetch2_max_elems_per_thread else 1
    return BwdConfig(block_m=block_m, num_warps=warps, programs_per_sm=per_sm, prefetch=prefetch)
