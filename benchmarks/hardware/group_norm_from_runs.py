"""The group_norm family's efficiency on the H100 from per-module kernel times.

PoolFormer's blocks normalize with GroupNorm over one group (timm's `GroupNorm1`) on NCHW
tensors. PyTorch's GroupNorm computes each (sample, group)'s statistics in one thread block, so
one group over a batch of 64 keeps 64 blocks busy: on an H100 the forward ran its bytes at well
under the copy rate, where the cost model priced it as a LayerNorm over rows of the tensor's
last dimension (W: 56 at PoolFormer's first stage). This derives the family's rate from the
committed per-module profile of PoolFormer-S12 there (correlate-h100/correlate-new2.json):
every GroupNorm's `aten::native_group_norm` and `aten::native_group_norm_backward` device time
against the trace's bytes of those ops at the profile's copy rate. The probe measures the
family too (`probe/workloads`: GroupNorm(1, 64) on 64x64x56x56 NCHW); a probe run replaces a
row this script wrote.

    python benchmarks/hardware/group_norm_from_runs.py [--write]   # --write: the profile
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import PerModule, family_row_main  # noqa: E402

PROFILE = ROOT / "benchmarks/results/probe-h100/h100-sxm.json"
ROW = PerModule(
    run="correlate-h100/correlate-new2.json",
    model="timm:poolformer_s12",
    family="group_norm",
    kernels=("aten::native_group_norm", "aten::native_group_norm_backward"),
    workload="{model}'s {n} GroupNorm(1, C), forward and backward, NCHW (the first {shape})",
    script=Path(__file__).name,
)
row = ROW.row


if __name__ == "__main__":
    family_row_main(ROW.family, row, __doc__.splitlines()[0], PROFILE)
