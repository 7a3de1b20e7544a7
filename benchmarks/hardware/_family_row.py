"""The command line of a script that derives one memory family's row of a profile (the shipped
H200 one unless the script names another) from committed measurements until the probe measures
the family there (`dropout_add_norm_from_bench.py`, `permuted_cat_from_runs.py`,
`transposed_copy_nchw_from_runs.py`, `avg_pool_from_runs.py`): print the row; with --write,
merge it into the profile, unless the profile holds a probe measurement of the family (a row
without "source")."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
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
    family: str, row: Callable[[Any], dict], description: str, path: Path = PROFILE
) -> None:
    """`row(spec)`: the family's row, priced with the profile at `path` applied to its chip."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"merge into {path.name}")
    args = parser.parse_args()
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
