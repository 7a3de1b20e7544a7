"""Measure graph-layers' replay rates (`graph_layer`, `graph_layer_param`: gpushape.probe.host)
on this GPU and add them to a profile's host rates, leaving its other rates as they are.

    python benchmarks/hardware/graph_layer_rates.py --profile P.json [-o out.json]

`gpushape probe` and `calibrate_memory_efficiency.py --parts host` measure them with the other
host rates; this adds them alone, so a profile whose host rates other results were predicted
with keeps those. The profile must be this GPU's (the rates are its host's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.hardware.lookup import current_gpu, get_gpu  # noqa: E402
from gpushape.hardware.profile import read_profile  # noqa: E402
from gpushape.probe.host import _graph_layer_rates  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: over --profile")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_layer_rates.py: needs a CUDA GPU")
    profile = read_profile(args.profile)
    here, theirs = current_gpu(), get_gpu(profile["gpu"])
    if here is None or here.name != theirs.name:
        sys.exit(f"graph_layer_rates.py: this GPU is not {theirs.name}, the profile's")
    rows = _graph_layer_rates(torch.device("cuda"), torch.bfloat16, args.repeats)
    for key, row in rows.items():
        print(f"{key:18} {row.get('seconds', 0.0) * 1e6:9.2f} us  {row.get('workload', row)}")
    profile["host"] = {**profile.get("host", {}), **rows}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    profile.setdefault("probe", {})["graph_layer_measured_at"] = stamp
    profile["probe"]["graph_layer_command"] = " ".join(sys.argv)
    print(f"wrote {write_profile(profile, args.output or args.profile)}")


if __name__ == "__main__":
    main()
