"""Measure the GPU's idle time at a boundary between two CUDA graph replays
(gpushape.probe.memory.measure_graph_replay_gap) on this GPU and add it to a profile of this
chip as `device_gap["graph_replay"]`, leaving its other numbers as they are.

    python benchmarks/hardware/measure_graph_replay_gap.py --profile P.json [-o OUT] [--dry-run]

`gpushape probe` measures it as it runs; this gives it to a profile measured before the gap
existed (the shipped H200 profile, an H100's), on a machine with that GPU.
"""

from __future__ import annotations

import sys

from _on_profile import profile_parser, this_gpus_profile, write_stamped

from gpushape.probe.memory import measure_graph_replay_gap


def main() -> None:
    parser = profile_parser(__doc__)
    parser.add_argument("--dry-run", action="store_true", help="print the gap, write nothing")
    args = parser.parse_args()
    profile = this_gpus_profile(args.profile, "measure_graph_replay_gap.py")
    gap = measure_graph_replay_gap("cuda")
    if gap is None:
        sys.exit("measure_graph_replay_gap.py: needs a CUDA GPU")
    print(
        f"{profile['gpu']}: {gap['seconds'] * 1e6:.2f} us a graph replay "
        f"(chain {gap['chain_s'] * 1e3:.3f} ms, one graph {gap['single_s'] * 1e3:.3f} ms)"
    )
    if args.dry_run:
        return
    profile.setdefault("device_gap", {})["graph_replay"] = gap
    write_stamped(
        profile, args.output or args.profile, "graph_replay_measured_at", "graph_replay_command"
    )


if __name__ == "__main__":
    main()
