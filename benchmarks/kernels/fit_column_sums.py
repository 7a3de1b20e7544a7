"""Sums down to one value a channel, by rows and channels, from `probe_column_sums.py`'s
timings, into a gpushape profile as "reduction@<rows>x<channels>" (column sums: a Linear's or
a channels_last convolution's bias gradient) and "channel_sum@<rows>x<channels>" (NCHW
per-channel sums). The cost model then prices each such sum at the grid point nearest its own
shape (tracing/sums.py) instead of by its width alone.

Each figure is the cost model's price of the sum (its minimum bytes at the profile's copy rate,
every memory family's efficiency and the kernel floor left out) over the time measured from
CUDA graphs: a small sum's time is its rate's to carry, so the model then prices it at what
was measured rather than at the floor.

    python benchmarks/kernels/fit_column_sums.py column_sums.json \\
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o PROFILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fit_sums import copy_rate_s, fit_main, row

from gpushape.hardware.lookup import get_gpu
from gpushape.hardware.profile import apply_profile
from gpushape.tracing.sums import CHANNEL_SUM, COLUMN_SUM

FAMILY = {"columns": COLUMN_SUM, "nchw": CHANNEL_SUM}


def fit(probe: dict, profile: dict) -> dict[str, dict]:
    """The profile's grid figures, one per timed (layout, rows, channels)."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    date = probe["environment"]["date_utc"][:10]
    out = {}
    for timed in probe["results"]:
        family = FAMILY.get(timed.get("layout"))
        if family is None or not timed.get("graph_us"):
            raise SystemExit(f"not a probe_column_sums.py row: {timed}")
        what = "columns of" if family == COLUMN_SUM else "channels of NCHW"
        out[f"{family}@{timed['rows']}x{timed['channels']}"] = row(
            timed["graph_us"] * 1e-6,
            copy_rate_s(spec, timed["shape"]),
            f"sum into {timed['channels']} {what} {'x'.join(map(str, timed['shape']))}, "
            f"CUDA graphs (probe_column_sums.py, {date})",
        )
    return out


def main(argv: list[str] | None = None) -> int:
    return fit_main(__doc__, "probe_column_sums.py", fit, argv)


if __name__ == "__main__":
    sys.exit(main())
