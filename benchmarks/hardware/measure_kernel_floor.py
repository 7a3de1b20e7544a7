"""Measure the kernel floor (`kernel_floor`, gpushape.probe.memory.measure_kernel_floor) on this
GPU and add it to a profile of this chip, leaving its other numbers as they are.

    python benchmarks/hardware/measure_kernel_floor.py --profile P.json [-o out.json] [--dry-run]

`gpushape probe` measures it as it runs; this gives it to a profile measured before the floor
existed (the shipped H200 profile, an H100's), on a machine with that GPU.
"""

from __future__ import annotations

from _on_profile import measure_into

from gpushape.probe.memory import measure_kernel_floor


def _describe(profile: dict, floor: dict) -> str:
    by_op = ", ".join(f"{k} {v:.2f}" for k, v in floor["by_op"].items())
    return f"{profile['gpu']}: kernel floor {floor['seconds'] * 1e6:.2f} us ({by_op} us)"


if __name__ == "__main__":
    measure_into(
        __doc__,
        "measure_kernel_floor.py",
        lambda: measure_kernel_floor("cuda"),
        _describe,
        lambda profile, floor: profile.__setitem__("kernel_floor", floor),
        "kernel_floor",
    )
