"""PyTorch's column sums (a Linear's bias gradient, `grad.sum(0)`) by width, from
`probe_bias_grad.py`'s timings, into a gpushape profile as "reduction@<width>"
(tracing/families.py `SIZE_BASE`): the cost model then prices a bias gradient at the rate
measured for the width nearest its own, not at the 1024-wide sum over 65536 rows the probe's
"reduction" measures. `gpushape probe` measures the same widths itself (probe/workloads); this
fills them in from the committed run without a GPU.

Each row: PyTorch's `sum(0)` at 16384 rows (BERT's and ViT's tokens a step), its time from
CUDA graphs, against the cost model's price of the op (its minimum bytes at the profile's copy
rate, every memory family's efficiency left out). Also, for every shape the probe timed, the
same sum as cuBLAS's GEMV against ones, as "gemv_column_sum@<rows>x<width>": what graph-layers'
bias gradients run (steps/graph_layers_gemv.py).

    python benchmarks/kernels/fit_bias_grad.py \\
        benchmarks/results/kernels-h200/probe_bias_grad.json \\
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o PROFILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fit_sums import copy_rate_s, fit_main, row

from gpushape.hardware.lookup import get_gpu
from gpushape.hardware.profile import apply_profile
from gpushape.tracing.families import SIZE_VARIANTS
from gpushape.tracing.sums import GEMV_SUM

ROWS = 16384
VARIANT = "torch sum(0)"
GEMV = "gemv ones"
WIDTHS = tuple(int(f.partition("@")[2]) for f in SIZE_VARIANTS if f.startswith("reduction@"))


def fit(probe: dict, profile: dict) -> dict[str, dict]:
    """The profile's "reduction@<width>" rows, one per width the probe timed at ROWS rows."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    date = probe["environment"]["date_utc"][:10]
    out = {}
    for width in WIDTHS:
        timed = next(
            (
                r
                for r in probe["results"]
                if r["shape"] == [ROWS, width] and r["variant"] == VARIANT
            ),
            None,
        )
        if timed is None:
            raise SystemExit(f"{VARIANT} at {ROWS}x{width} is not in the probe's results")
        out[f"reduction@{width}"] = row(
            timed["graph_us"] * 1e-6,
            copy_rate_s(spec, (ROWS, width)),
            f"sum over rows of {ROWS}x{width} (a bias gradient), CUDA graphs "
            f"(probe_bias_grad.py, {date})",
        )
    for timed in probe["results"]:  # cuBLAS's GEMV against ones, which graph-layers takes
        if timed["variant"] == GEMV:
            rows, width = timed["shape"]
            out[f"{GEMV_SUM}@{rows}x{width}"] = row(
                timed["graph_us"] * 1e-6,
                copy_rate_s(spec, (rows, width)),
                f"a GEMV against ones over {rows}x{width} (graph-layers' bias gradient), "
                f"CUDA graphs (probe_bias_grad.py, {date})",
            )
    return out


def main(argv: list[str] | None = None) -> int:
    return fit_main(__doc__, "probe_bias_grad.py", fit, argv)


if __name__ == "__main__":
    sys.exit(main())
