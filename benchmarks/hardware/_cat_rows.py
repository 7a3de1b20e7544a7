"""A family of PyTorch's cat kernel (`CatArrayBatchedCopy`: a cat or stack reading a permuted
input) derived from a committed timed step, until the probe measures it on that chip
(`permuted_cat_from_runs.py`, `permuted_stack_from_runs.py`): the family's ops in the model's
trace, their bytes at the profile's copy rate, against the step's `CatArrayBatchedCopy` time
less what the profile prices its other cats and stacks at (their contiguous path)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import derived_row, family_row_main  # noqa: E402

from gpushape.models import resolve_model  # noqa: E402
from gpushape.tracing.cost import op_cost  # noqa: E402
from gpushape.tracing.families import memory_family  # noqa: E402
from gpushape.tracing.tracer import trace  # noqa: E402

KERNEL = "CatArrayBatchedCopy"
H100_PROFILE = ROOT / "benchmarks/results/probe-h100/h100-sxm.json"


@dataclass(frozen=True)
class Source:
    """Where a chip's number comes from: a timed step of `model`, as a `gpushape bench`
    variant or a fix-by-fix loop's stage."""

    chip: str  # as the run's GPU names it
    profile: Path
    run: str  # under benchmarks/results
    variant: str
    part: str  # "variants" (bench) or "stages" (a loop)
    model: str


def cat_kernels_row(
    spec, source: Source, family: str, describe: Callable[[int, str, int], str], script: str
) -> dict:
    """The family's row from `source` (module docstring); `describe(ops, shape, batch)`."""
    data = json.loads((ROOT / "benchmarks/results" / source.run).read_text())
    if source.chip not in data["environment"]["gpu"]:
        raise SystemExit(f"{source.run}: not an {source.chip} run")
    step = data[source.part][source.variant]
    measured = sum(s for name, s in step["top_kernels"] if KERNEL in name)
    # a bench run's batch, or a loop's stage's samples a step
    batch = int(data["batch"][0].split("x")[0]) if source.part == "variants" else step["samples"]
    r = resolve_model(source.model, batch=batch)
    joined = ("aten.cat", "aten.stack")
    every = [o for o in trace(r.model, r.example_inputs, train=True).ops
             if any(j in o.op for j in joined)]  # fmt: skip
    mine = [o for o in every if memory_family(o) == family]
    others_s = sum(op_cost(o, spec).kernel_time_s for o in every if o not in mine)
    if not mine or others_s >= measured:
        raise SystemExit(f"{source.run}: no {family} op to price, or the others take all the time")
    measured -= others_s
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    family_s = sum(op_cost(o, flat).kernel_time_s for o in mine)  # their bytes at the copy rate
    shape = "x".join(str(n) for n in next(t for t in mine[0].inputs if t.numel).shape)
    kind = "variant" if source.part == "variants" else "stage"
    return derived_row(
        family_s,
        measured,
        describe(len(mine), shape, batch),
        f"benchmarks/results/{source.run}, {source.variant!r} {kind}'s {KERNEL} kernels a step, "
        f"less {len(every) - len(mine)} other cats and stacks as priced ({script})",
        other_cats_priced_s=others_s,
    )


def chip_main(
    family: str, sources: Mapping[str, Source], row: Callable[..., dict], description: str
) -> None:
    """A script's command line: `--chip` picks the source (and the profile it writes), the
    rest is `_family_row.family_row_main`'s. `row(spec, source=...)`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--chip", choices=sorted(sources), default="h200")
    args, rest = parser.parse_known_args()
    source = sources[args.chip]
    chip_row = functools.partial(row, source=source)
    family_row_main(family, chip_row, description, source.profile, rest)
