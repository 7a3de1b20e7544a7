"""Measure the kernel floor (`kernel_floor`, gpushape.probe.memory.measure_kernel_floor) on this
GPU and add it to a profile of this chip, leaving its other numbers as they are.

    python benchmarks/hardware/measure_kernel_floor.py --profile P.json [-o out.json] [--dry-run]

`gpushape probe` measures it as it runs; this gives it to a profile measured before the floor
existed (the shipped H200 profile, an H100's), on a machine with that GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.hardware import current_gpu, get_gpu  # noqa: E402
from gpushape.hardware.profile import read_profile  # noqa: E402
from gpushape.probe.memory import measure_kernel_floor  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: over --profile")
    parser.add_argument("--dry-run", action="store_true", help="print the floor, write nothing")
    args = parser.parse_args()
    profile = read_profile(args.profile)
    here = current_gpu()
    if here is None or here.name != get_gpu(profile["gpu"]).name:
        found = "no CUDA GPU" if here is None else here.name
        sys.exit(f"measure_kernel_floor.py: {args.profile} is {profile['gpu']}'s; here: {found}")
    floor = measure_kernel_floor("cuda")
    if floor is None:
        sys.exit("measure_kernel_floor.py: the profiler saw no kernels")
    by_op = ", ".join(f"{k} {v:.2f}" for k, v in floor["by_op"].items())
    print(f"{profile['gpu']}: kernel floor {floor['seconds'] * 1e6:.2f} us ({by_op} us)")
    if args.dry_run:
        return
    profile["kernel_floor"] = floor
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    profile.setdefault("probe", {})["kernel_floor_measured_at"] = stamp
    profile["probe"]["kernel_floor_command"] = " ".join(sys.argv)
    print(f"wrote {write_profile(profile, args.output or args.profile)}")


if __name__ == "__main__":
    main()
