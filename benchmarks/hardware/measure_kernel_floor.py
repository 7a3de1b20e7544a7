"""Measure the kernel floor (`kernel_floor`, gpushape.probe.memory.measure_kernel_floor) on this
GPU and add it to a profile of this chip, leaving its other numbers as they are.

    python benchmarks/hardware/measure_kernel_floor.py --profile P.json [-o out.json] [--dry-run]

`gpushape probe` measures it as it runs; this gives it to a profile measured before the floor
existed (the shipped H200 profile, an H100's), on a machine with that GPU.
"""

from __future__ import annotations

import sys

from _on_profile import profile_parser, this_gpus_profile, write_stamped

from gpushape.probe.memory import measure_kernel_floor


def main() -> None:
    parser = profile_parser(__doc__)
    parser.add_argument("--dry-run", action="store_true", help="print the floor, write nothing")
    args = parser.parse_args()
    profile = this_gpus_profile(args.profile, "measure_kernel_floor.py")
    floor = measure_kernel_floor("cuda")
    if floor is None:
        sys.exit("measure_kernel_floor.py: the profiler saw no kernels")
    by_op = ", ".join(f"{k} {v:.2f}" for k, v in floor["by_op"].items())
    print(f"{profile['gpu']}: kernel floor {floor['seconds'] * 1e6:.2f} us ({by_op} us)")
    if args.dry_run:
        return
    profile["kernel_floor"] = floor
    write_stamped(
        profile, args.output or args.profile, "kernel_floor_measured_at", "kernel_floor_command"
    )


if __name__ == "__main__":
    main()
