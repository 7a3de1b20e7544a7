"""Measure the GPU's idle time at a boundary between two CUDA graph replays
(gpushape.probe.memory.measure_graph_replay_gap) on this GPU and add it to a profile of this
chip as `device_gap["graph_replay"]`, leaving its other numbers as they are.

    python benchmarks/hardware/measure_graph_replay_gap.py --profile P.json [-o OUT] [--dry-run]

`gpushape probe` measures it as it runs; this gives it to a profile measured before the gap
existed (the shipped H200 profile, an H100's), on a machine with that GPU.
"""

from __future__ import annotations

from _on_profile import measure_into

from gpushape.probe.memory import measure_graph_replay_gap


def _describe(profile: dict, gap: dict) -> str:
    return (
        f"{profile['gpu']}: {gap['seconds'] * 1e6:.2f} us a graph replay "
        f"(chain {gap['chain_s'] * 1e3:.3f} ms, one graph {gap['single_s'] * 1e3:.3f} ms)"
    )


if __name__ == "__main__":
    measure_into(
        __doc__,
        "measure_graph_replay_gap.py",
        lambda: measure_graph_replay_gap("cuda"),
        _describe,
        lambda profile, gap: profile.setdefault("device_gap", {}).__setitem__("graph_replay", gap),
        "graph_replay",
    )
