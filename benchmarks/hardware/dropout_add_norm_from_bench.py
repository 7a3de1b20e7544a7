"""The fused_dropout_add_norm family's efficiency from the kernel benchmark timed on the H200.

The probe measures the family (`probe/workloads`: gpushape's dropout_add_layer_norm at BERT-base's
block output, 16384 x 768, a training step replayed from a CUDA graph). Until it runs on the
H200, the shipped profile takes the same number from `bench_dropout_add_norm.py`'s run there
(kernels-h200/bench_dropout_add_norm.json, the shipped launch shape, forward and backward from a
CUDA graph): the family's 8 passes over one (M, N) tensor at the profile's copy rate, over the
measured time. The row says where it came from; a probe run replaces it.

    python benchmarks/hardware/dropout_add_norm_from_bench.py [--write]   # --write: the profile
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from _family_row import derived_row, family_row_main  # noqa: E402

RUN = "kernels-h200/bench_dropout_add_norm.json"
FAMILY = "fused_dropout_add_norm"
PASSES = 8  # as the probe's workload counts them (probe/workloads)
VARIANT = "gpushape default"


def row(spec) -> dict:
    data = json.loads((ROOT / "benchmarks/results" / RUN).read_text())
    if "H200" not in data["environment"]["gpu"]:
        raise SystemExit(f"{RUN}: not an H200 run")
    m, n = data["shape"]
    measured = next(r for r in data["results"] if r["variant"] == VARIANT)["forward+backward us"]
    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency={}))
    family_s = PASSES * m * n * 2 / flat.attainable_bandwidth_bytes_per_s()
    return derived_row(
        family_s,
        measured * 1e-6,
        f"gpushape dropout_add_layer_norm(p={data['p']}) on {m}x{n} (BERT-base's block output)",
        f"benchmarks/results/{RUN}, {VARIANT!r} forward+backward (dropout_add_norm_from_bench.py)",
    )


def main() -> None:
    family_row_main(FAMILY, row, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
