"""The command line of a script that derives one memory family's row of a profile (the shipped
H200 one unless the script names another) from committed measurements until the probe measures
the family there (`dropout_add_norm_from_bench.py`, `permuted_cat_from_runs.py`,
`transposed_copy_nchw_from_runs.py`, `avg_pool_from_runs.py`, `group_norm_from_runs.py`): print
the row; with --write,
merge it into the profile, unless the profile holds a probe measurement of the family (a row
without "source")."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.memory import capped  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

PROFILE = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"


def derived_row(
    family_s: float, measured_s: float, workload: str, source: str, **extra: Any
) -> dict:
    """A profile row as the probe writes one (bf16), for bytes that take `family_s` at the copy
    rate and took `measured_s`, with where it came from (`source`) and any `extra` fields."""
    return {
        "efficiency": capped(family_s, measured_s),
        "workload": workload,
        "dtype": "bfloat16",
        "measured_s": measured_s,
        "family_roofline_s": family_s,
        "other_roofline_s": 0.0,
        **extra,
        "source": source,
    }


def family_row_main(
    family: str,
    row: Callable[[Any], dict],
    description: str,
    path: Path = PROFILE,
    argv: list[str] | None = None,
) -> None:
    """`row(spec)`: the family's row, priced with the profile at `path` applied to its chip.
    `argv`: the options left to this parser (a script that reads its own first)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"merge into {path.name}")
    args = parser.parse_args(argv)
    profile = read_profile(path)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(path))
    found = row(spec)
    us = found["measured_s"] * 1e6, found["family_roofline_s"] * 1e6
    print(f"{family}: efficiency {found['efficiency']:.4f} ({found['workload']}, "
          f"{us[0]:.1f} us against {us[1]:.1f})")  # fmt: skip
    if args.write:
        current = profile["memory_efficiency"].get(family)
        if current is not None and "source" not in current:
            raise SystemExit(f"{family}: the profile has a probe measurement; left as it is")
        profile["memory_efficiency"][family] = found
        print(f"wrote {write_profile(profile, path)}")


@dataclass(frozen=True)
class PerModule:
    """A family's row from a committed per-module profile (`correlate.py --ops`, `run` under
    benchmarks/results/): the device time of `kernels` in every module of `model` whose trace
    holds an op of `family`, against the trace's bytes of those ops at the copy rate.
    `workload`: the row's description, formatted with {model} (no prefix), {n} (modules) and
    {shape} (the first op's input). `row(spec)` is what a script's --write merges."""

    run: str
    model: str
    family: str
    kernels: tuple[str, ...]
    workload: str
    script: str

    def row(self, spec: Any) -> dict:
        from gpushape.models import resolve_model
        from gpushape.tracing.cost import op_cost
        from gpushape.tracing.families import memory_family
        from gpushape.tracing.tracer import trace

        data = json.loads((ROOT / "benchmarks/results" / self.run).read_text())
        gpu = data["environment"]["gpu"]
        if spec.name.split("-")[0].upper() not in gpu.upper():
            raise SystemExit(f"{self.run}: a run on {gpu}, not for {spec.name}")
        (result,) = [r for r in data["results"] if r["model"] == self.model]
        r = resolve_model(self.model, batch=result["batch"])
        ops = [op for op in trace(r.model, r.example_inputs, train=True).ops
               if memory_family(op) == self.family]  # fmt: skip
        modules = sorted({op.module for op in ops})
        if not modules:
            raise SystemExit(f"the trace of {self.model} has no {self.family} op")
        bandwidth = spec.attainable_bandwidth_bytes_per_s()
        family_s = sum(op_cost(op, spec).min_bytes for op in ops) / bandwidth
        measured = sum(
            result["ops"][m]["measured_s"].get(k, 0.0) for m in modules for k in self.kernels
        )
        shape = "x".join(str(n) for n in ops[0].inputs[0].shape)
        name = self.model.partition(":")[2]
        return derived_row(
            family_s,
            measured,
            self.workload.format(model=name, n=len(modules), shape=shape),
            f"benchmarks/results/{self.run}, each module's {' and '.join(self.kernels)} device "
            f"time a step ({self.script})",
        )
