"""The permuted_cat family's efficiency from a GPT-2 step timed on the H200.

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

    python benchmarks/hardware/permuted_cat_from_runs.py [--write]   # --write: the profile
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import derived_row, family_row_main  # noqa: E402

from gpushape.models import resolve_model  # noqa: E402
from gpushape.tracing.cost import op_cost  # noqa: E402
from gpushape.tracing.families import PERMUTED_CAT, memory_family  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

RUN = "bench-h200/gpt2.json"
VARIANT = "optimize"  # kept transformers' default use_cache=True (no-kv-cache came later)
KERNEL = "CatArrayBatchedCopy"


def row(spec) -> dict:
    data = json.loads((ROOT / "benchmarks/results" / RUN).read_text())
    if "H200" not in data["environment"]["gpu"]:
        raise SystemExit(f"{RUN}: not an H200 run")
    kernels = data["variants"][VARIANT]["top_kernels"]
    measured = sum(s for name, s in kernels if KERNEL in name)
    batch, seq = (int(n) for n in data["batch"][0].split(":")[0].split("x"))
    r = resolve_model("hf:gpt2", batch=batch)
    every = [o for o in trace(r.model, r.example_inputs, train=True).ops if "aten.cat" in o.op]
    cats = [o for o in every if memory_family(o) == PERMUTED_CAT]
    # the backward's cats of the attention projection's three gradients run the same kernel,
    # its contiguous path: priced at the profile's rate for them and taken off the measured time
    others_s = sum(op_cost(o, spec).kernel_time_s for o in every if o not in cats)
    if not cats or others_s >= measured:
        raise SystemExit(f"{RUN}: no cache append to price, or the other cats take all the time")
    measured -= others_s
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    family_s = sum(op_cost(o, flat).kernel_time_s for o in cats)  # their bytes at the copy rate
    shape = "x".join(str(n) for n in next(t for t in cats[0].inputs if t.numel).shape)
    return derived_row(
        family_s,
        measured,
        f"GPT-2's key/value cache appends, {len(cats)} cats of {shape} read permuted onto an "
        f"empty cache (batch {batch} x {seq})",
        f"benchmarks/results/{RUN}, {VARIANT!r} variant's {KERNEL} kernels a step, less "
        f"{len(every) - len(cats)} contiguous cats as priced (permuted_cat_from_runs.py)",
        other_cats_priced_s=others_s,
    )


def main() -> None:
    family_row_main(PERMUTED_CAT, row, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
