"""Measure graph-layers' replay rates (`graph_layer`, `graph_layer_param`: gpushape.probe.host)
on this GPU and add them to a profile's host rates, leaving its other rates as they are.

    python benchmarks/hardware/graph_layer_rates.py --profile P.json [-o out.json]

`gpushape probe` and `calibrate_memory_efficiency.py --parts host` measure them with the other
host rates; this adds them alone, so a profile whose host rates other results were predicted
with keeps those. The profile must be this GPU's (the rates are its host's).
"""

from __future__ import annotations

import sys

import torch
from _on_profile import profile_parser, this_gpus_profile, write_stamped

from gpushape.probe.host import _graph_layer_rates


def main() -> None:
    parser = profile_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_layer_rates.py: needs a CUDA GPU")
    profile = this_gpus_profile(args.profile, "graph_layer_rates.py")
    rows = _graph_layer_rates(torch.device("cuda"), torch.bfloat16, args.repeats)
    for key, row in rows.items():
        print(f"{key:18} {row.get('seconds', 0.0) * 1e6:9.2f} us  {row.get('workload', row)}")
    profile["host"] = {**profile.get("host", {}), **rows}
    write_stamped(
        profile, args.output or args.profile, "graph_layer_measured_at", "graph_layer_command"
    )


if __name__ == "__main__":
    main()
