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

import argparse
import dataclasses
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import PROFILE, derived_row, family_row_main  # noqa: E402

from gpushape.models import resolve_model  # noqa: E402
from gpushape.tracing.cost import op_cost  # noqa: E402
from gpushape.tracing.families import PERMUTED_CAT, memory_family  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

KERNEL = "CatArrayBatchedCopy"


@dataclass(frozen=True)
class Source:
    """Where a chip's number comes from: a timed GPT-2 step that kept transformers' default
    use_cache=True, as a `gpushape bench` variant or a fix-by-fix loop's stage."""

    chip: str  # as the run's GPU names it
    profile: Path
    run: str
    variant: str
    part: str  # "variants" (bench) or "stages" (a loop)


SOURCES = {
    "h200": Source("H200", PROFILE, "bench-h200/gpt2.json", "optimize", "variants"),
    "h100": Source(
        "H100",
        ROOT / "benchmarks/results/probe-h100/h100-sxm.json",
        "loops-h100-34/loop-hf_gpt2-eager.json",
        "as given",
        "stages",
    ),
}


def row(spec, source: Source = SOURCES["h200"]) -> dict:
    data = json.loads((ROOT / "benchmarks/results" / source.run).read_text())
    if source.chip not in data["environment"]["gpu"]:
        raise SystemExit(f"{source.run}: not an {source.chip} run")
    step = data[source.part][source.variant]
    measured = sum(s for name, s in step["top_kernels"] if KERNEL in name)
    if source.part == "variants":
        batch, seq = (int(n) for n in data["batch"][0].split(":")[0].split("x"))
    else:  # a loop's stage: its samples and tokens a step
        batch, seq = step["samples"], step["tokens"] // step["samples"]
    r = resolve_model("hf:gpt2", batch=batch)
    every = [o for o in trace(r.model, r.example_inputs, train=True).ops if "aten.cat" in o.op]
    cats = [o for o in every if memory_family(o) == PERMUTED_CAT]
    # the backward's cats of the attention projection's three gradients run the same kernel,
    # its contiguous path: priced at the profile's rate for them and taken off the measured time
    others_s = sum(op_cost(o, spec).kernel_time_s for o in every if o not in cats)
    if not cats or others_s >= measured:
        raise SystemExit(
            f"{source.run}: no cache append to price, or the other cats take all the time"
        )
    measured -= others_s
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    family_s = sum(op_cost(o, flat).kernel_time_s for o in cats)  # their bytes at the copy rate
    shape = "x".join(str(n) for n in next(t for t in cats[0].inputs if t.numel).shape)
    return derived_row(
        family_s,
        measured,
        f"GPT-2's key/value cache appends, {len(cats)} cats of {shape} read permuted onto an "
        f"empty cache (batch {batch} x {seq})",
        f"benchmarks/results/{source.run}, {source.variant!r} "
        f"{'variant' if source.part == 'variants' else 'stage'}'s {KERNEL} kernels a step, less "
        f"{len(every) - len(cats)} contiguous cats as priced (permuted_cat_from_runs.py)",
        other_cats_priced_s=others_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--chip", choices=sorted(SOURCES), default="h200")
    args, rest = parser.parse_known_args()
    source = SOURCES[args.chip]
    chip_row = functools.partial(row, source=source)
    family_row_main(PERMUTED_CAT, chip_row, __doc__.splitlines()[0], source.profile, rest)


if __name__ == "__main__":
    main()
