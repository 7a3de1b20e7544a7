"""The avg_pool_nchw family's efficiency on the H100 from per-module kernel times.

EfficientFormer-L1's token mixer is `pool(x) - x` with a 3x3 stride-1 average pool
(count_include_pad=False), PoolFormer's too: PyTorch's NCHW kernels ran it far below the max
pool's rate that priced it before (`pool_nchw`, ResNet's 3x3 stride-2 stem pool). The probe
measures the family (`probe/workloads`: AvgPool2d(3, 1, 1) on 64x48x56x56, NCHW and
channels_last): on the H100 0.0633 NCHW (2026-12-07, the profile's row since; 0.0475
channels_last). Before that run the H100 probe's profile took the number from the committed
per-module profile of EfficientFormer-L1 there (correlate-h100/correlate-new.json), and this
script derives it still, as a check (0.0603): every token mixer's `aten::avg_pool2d` and
`aten::avg_pool2d_backward` device time against the trace's bytes of those ops at the
profile's copy rate. A row written with --write says where it came from; a probe run replaces
it.

    python benchmarks/hardware/avg_pool_from_runs.py [--write]   # --write: the profile
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import PerModule, family_row_main  # noqa: E402

PROFILE = ROOT / "benchmarks/results/probe-h100/h100-sxm.json"
ROW = PerModule(
    run="correlate-h100/correlate-new.json",
    model="timm:efficientformer_l1",
    family="avg_pool_nchw",
    kernels=("aten::avg_pool2d", "aten::avg_pool2d_backward"),
    workload="{model}'s {n} token mixers' AvgPool2d(3, 1, 1), forward and backward, NCHW "
    "(the first {shape})",
    script=Path(__file__).name,
)
row = ROW.row


if __name__ == "__main__":
    family_row_main(ROW.family, row, __doc__.splitlines()[0], PROFILE)
