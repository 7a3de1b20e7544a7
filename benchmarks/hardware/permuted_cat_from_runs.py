"""The permuted_cat family's efficiency from a GPT-2 step timed on the H200 (or an H100).

A key/value cache's first append is a `cat` of one tensor read permuted (GPT-2's keys and
values, (B, T, H, D) viewed as (B, H, T, D), onto an empty cache), which PyTorch runs with its
cat kernel's strided path (`CatArrayBatchedCopy`), not the copy kernel the permuted_copy family
measured. The probe measures the family (`probe/workloads`: one such cat, forward). Until it
runs on the H200, the shipped profile takes the number from a committed eager GPT-2 step
(bench-h200/gpt2.json, the `optimize` variant, which kept the cache: its per-step kernel
times): the step's cache appends as the cost model traces them (batch 8 x 1024, 24 cats), their
bytes at the profile's copy rate, over the measured `CatArrayBatchedCopy` time less what the
profile prices the step's other cats at (the backward's 12 of the attention projection's three
gradients, which run that kernel's contiguous path). The row says
where it came from; a probe run replaces it.

The H100 probe's profile (benchmarks/results/probe-h100/h100-sxm.json) was measured before the
probe had the family, and priced the cache's appends as permuted copies: GPT-2's no-kv-cache
was predicted at 0.915 ms of GPU time against 1.551 measured on an H100
(loops-h100-34/loop-hf_gpt2-eager.json). `--chip h100` takes the number from that loop's step as
given (the same model and batch, the cache kept) and writes that profile; copy it to the
shipped one after (`cp benchmarks/results/probe-h100/h100-sxm.json
src/gpushape/hardware/profiles/`).

    python benchmarks/hardware/permuted_cat_from_runs.py [--chip h100] [--write]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _cat_rows import H100_PROFILE, Source, cat_kernels_row, chip_main  # noqa: E402
from _family_row import PROFILE  # noqa: E402

from gpushape.tracing.families import PERMUTED_CAT  # noqa: E402

# timed GPT-2 steps that kept transformers' default use_cache=True
SOURCES = {
    "h200": Source("H200", PROFILE, "bench-h200/gpt2.json", "optimize", "variants", "hf:gpt2"),
    "h100": Source(
        "H100",
        H100_PROFILE,
        "loops-h100-34/loop-hf_gpt2-eager.json",
        "as given",
        "stages",
        "hf:gpt2",
    ),
}


def row(spec, source: Source = SOURCES["h200"]) -> dict:
    def describe(ops: int, shape: str, batch: int) -> str:
        return (
            f"GPT-2's key/value cache appends, {ops} cats of {shape} read permuted onto an "
            f"empty cache (batch {batch} x 1024)"
        )

    return cat_kernels_row(spec, source, PERMUTED_CAT, describe, "permuted_cat_from_runs.py")


def main() -> None:
    chip_main(PERMUTED_CAT, SOURCES, row, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
