"""The permuted_stack family's efficiency from a ViT-B/16 step timed on the H200 (or an H100).

timm's attention splits one qkv projection with reshape, permute and `unbind(0)`; autograd's
backward of the unbind stacks SDPA's dQ, dK and dV back, each laid out as the permuted view
it was, and PyTorch runs that stack with its cat kernel's strided path (`CatArrayBatchedCopy`),
as it runs a key/value cache's lone append (`permuted_cat`), but faster: on an H100 a stack
took about a third of the copy rate where a cache append took a fifth. Pricing the stacks as
appends took SDPA's measured saving on Swin-T from 0.92x to 0.59x
(benchmarks/results/loops-h100-34/README.md). The probe measures the family
(`probe/workloads`: one such stack, forward); until it runs on a chip, the row comes from a
committed eager ViT-B/16 step as given (batch 64, its 12 stacks a step): their bytes at the
profile's copy rate over the step's `CatArrayBatchedCopy` time, less what the profile prices the
step's other cats at. Swin-T's stacks (`loops-h100-34`, the `+ sdpa` stage) check it out of
sample. The row says where it came from; a probe run replaces it.

    python benchmarks/hardware/permuted_stack_from_runs.py [--chip h100] [--write]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _cat_rows import H100_PROFILE, Source, cat_kernels_row, chip_main  # noqa: E402
from _family_row import PROFILE  # noqa: E402

from gpushape.tracing.families import PERMUTED_STACK  # noqa: E402

VIT = "timm:vit_base_patch16_224"
SOURCES = {
    "h200": Source(
        "H200",
        PROFILE,
        "bench-h200/loop-timm_vit_base_patch16_224-eager.json",
        "as given",
        "stages",
        VIT,
    ),
    "h100": Source(
        "H100",
        H100_PROFILE,
        "loops-h100-34/loop-timm_vit_base_patch16_224-eager.json",
        "as given",
        "stages",
        VIT,
    ),
}


def row(spec, source: Source = SOURCES["h200"]) -> dict:
    def describe(ops: int, shape: str, batch: int) -> str:
        return (
            f"ViT-B/16's unbind backward, {ops} stacks of three {shape} read permuted (SDPA's "
            f"dQ, dK, dV; batch {batch})"
        )

    return cat_kernels_row(spec, source, PERMUTED_STACK, describe, "permuted_stack_from_runs.py")


def main() -> None:
    chip_main(PERMUTED_STACK, SOURCES, row, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
