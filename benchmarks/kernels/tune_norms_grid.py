"""The launch configurations tune_norms.py tries, per row shape, and the table lines it prints.

Register arithmetic behind the grid (sm_90: 65536 32-bit registers and at most 64 warps per SM):
a backward thread holding E elements of a tile keeps about 6 E live values (x, dy, weight, bias,
the dweight and dbias accumulators), so E = 8 needs ~100 registers: at most ~20 warps per SM,
one 16-warp program. E = 4 (or reloading weight and bias) leaves room for two or three programs
per SM, whose row reductions (barriers) then overlap.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.kernels.norms._tuning import BwdConfig, FwdConfig, pow2

_WARPS = (2, 4, 8, 16, 32)


def _tiles(
    block_n: int, elems_per_thread: tuple[int, ...], max_tile: int, max_block_m: int
) -> list[tuple[int, int]]:
    """(block_m, num_warps) with block_m * block_n / (32 num_warps) in elems_per_thread."""
    out = []
    block_m = 1
    while block_m <= max_block_m and block_m * block_n <= max_tile:
        for ept in elems_per_thread:
            warps = block_m * block_n // (32 * ept)
            if warps in _WARPS:
                out.append((block_m, warps))
        block_m *= 2
    return out


def fwd_grid(m: int, n: int, quick: bool) -> list[FwdConfig]:
    block_n = pow2(n)
    ept = (8, 16) if quick else (8, 16, 32)
    configs = [
        FwdConfig(block_m=bm, num_warps=w)
        for bm, w in _tiles(block_n, ept, 16384, 4 if quick else 8)
    ]
    if block_n >= 8192:  # looped: chunks of the row, second pass from L2
        configs += [
            FwdConfig(block_m=1, num_warps=w, block_n=bn)
            for bn in (2048, 4096)
            for w in (4, 8)
            if bn < block_n
        ]
    return configs


# Backward candidates per BLOCK_N, most promising first (a budget may cut the tail):
# (block_m, num_warps, prefetch, reload_wb, programs per SM to try; block_n > 0: looped).
_BWD: dict[int, list[tuple]] = {
    1024: [
        (2, 8, 2, False, (2, 3, 4)),
        (2, 16, 1, False, (1, 2, 3)),
        (4, 16, 1, False, (1, 2)),
        (1, 4, 1, True, (4, 6, 8)),
        (2, 8, 0, True, (3, 4, 6)),
        (4, 32, 1, False, (1, 2)),
        (1, 2, 1, False, (8, 12, 16)),
        (8, 32, 1, False, (1,)),
    ],
    4096: [
        (1, 16, 1, True, (1, 2, 3)),
        (1, 16, 2, False, (1, 2)),
        (1, 32, 1, False, (1, 2)),
        (1, 8, 1, True, (2, 3, 4, 6)),
        (1, 16, 0, True, (2, 3, 4)),
        (1, 8, 0, True, (4, 6, 8)),
        (2, 32, 1, False, (1,)),
    ],
    8192: [
        (1, 32, 1, True, (1, 2)),
        (1, 16, 1, True, (1, 2, 3)),
        (1, 32, 0, True, (1, 2)),
        (1, 32, 2, False, (1,)),
    ],
    16384: [(1, 32, 1, True, (1,)), (1, 32, 0, True, (1, 2))],
}
_BWD_LOOPED = [(4096, 8, (2, 4)), (4096, 16, (1, 2)), (2048, 8, (2, 4)), (2048, 4, (4, 8))]


def bwd_grid(m: int, n: int, quick: bool) -> list[BwdConfig]:
    block_n = pow2(n)
    configs = []
    whole = _BWD.get(block_n, [(1, 16, 1, True, (1, 2))])
    for bm, w, prefetch, reload_wb, per_sm in whole[: 3 if quick else None]:
        configs += [
            BwdConfig(
                block_m=bm, num_warps=w, prefetch=prefetch, reload_wb=reload_wb, programs_per_sm=p
            )
            for p in per_sm
        ]
    if block_n >= 8192:  # looped: row sums first (5 passes), column blocks in registers
        for bn, w, per_sm in _BWD_LOOPED[: 2 if quick else None]:
            configs += [
                BwdConfig(block_m=1, num_warps=w, programs_per_sm=p, block_n=bn) for p in per_sm
            ]
    return configs


def table_lines(best: list[dict]) -> list[str]:
    """TableEntry(...) source lines from the best rows, one per row width, first op's winners."""
    by_width: dict[int, dict[str, str]] = {}
    for r in best:
        entry = by_width.setdefault(pow2(r["shape"][1]), {})
        entry.setdefault(r["direction"], r["config"])
    return [
        f"    TableEntry(block_n={w}, fwd={e.get('fwd')}, bwd={e.get('bwd')}),"
        for w, e in sorted(by_width.items())
    ]
