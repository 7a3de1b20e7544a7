"""Measure the host's rates of some op classes (gpushape.probe.host's chains) on this GPU and add
them to a profile's host rates, leaving its other rates as they are.

    python benchmarks/hardware/host_class_rates.py --profile P.json --classes gpushape_group_norm

A class added after the profile was measured (GroupNormAct's `gpushape_group_norm`, priced as
`gpushape`, BatchNormAct2d's, until measured) gets its forward and backward rates without
touching the rates other results were predicted with. The profile must be this GPU's (the
rates are its host's).
"""

from __future__ import annotations

import sys

import torch
from _on_profile import profile_parser, this_gpus_profile, write_stamped

from gpushape.probe.host import measure_host


def main() -> None:
    parser = profile_parser(__doc__)
    parser.add_argument("--classes", required=True, help="op classes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_class_rates.py: needs a CUDA GPU")
    classes = [c for c in args.classes.split(",") if c]
    profile = this_gpus_profile(args.profile, "host_class_rates.py")
    rates = measure_host("cuda", repeats=args.repeats, classes=classes)
    rows = {k: v for k, v in rates.items() if k.split("/")[0] in classes}
    missing = [c for c in classes if c not in rows]
    if missing:
        sys.exit(f"host_class_rates.py: no chain measured for {', '.join(missing)}: {rows}")
    for key, row in rows.items():
        print(f"{key:28} {row.get('seconds', 0.0) * 1e6:9.2f} us  {row.get('workload', row)}")
    profile["host"] = {**profile.get("host", {}), **rows}
    write_stamped(profile, args.output or args.profile, "host_classes_measured_at",
                  "host_classes_command")  # fmt: skip


if __name__ == "__main__":
    main()
