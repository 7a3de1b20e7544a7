"""Where does the host's time go in an eager training step? For each variant of `gpushape
bench`, torch.profiler over a few steps with CPU and CUDA activities: the step's wall time, the
GPU's busy time, and the CPU ops with the most self time (Python-level modules show up as
their ATen calls; Triton launches as the kernels' Python wrappers).

    python benchmarks/steps/host_profile.py hf:gpt2 --vs eager,optimize --out $OUT/host.json
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from _variants import each_variant, parser, wall_then_profiled

from gpushape.bench import write_results

STEPS = 5


def host_profile(run, steps: int = STEPS, top: int = 20) -> dict:
    wall, prof = wall_then_profiled(run, steps)
    cpu: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    gpu_busy = 0.0
    for e in prof.events():
        if e.device_type.name == "CUDA":
            gpu_busy += e.device_time
        else:
            cpu[e.name][0] += e.self_cpu_time_total
            cpu[e.name][1] += 1
    rows = sorted(cpu.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_ms_unprofiled": wall * 1e3,
        "gpu_busy_ms": gpu_busy / steps / 1e3,
        "cpu_self_ms_total": sum(v[0] for v in cpu.values()) / steps / 1e3,
        "cpu_ops_per_step": sum(v[1] for v in cpu.values()) / steps,
        "top_cpu_self": [(k, v[0] / steps / 1e3, v[1] / steps) for k, v in rows],
    }


def main() -> None:
    args = parser("host_profile.json", optimizer="auto").parse_args()
    results = {}
    for name, variant in each_variant(args):
        r = host_profile(variant.run)
        results[name] = {**r, "notes": variant.notes}
        print(
            f"== {name}: wall {r['wall_ms_unprofiled']:.2f} ms, GPU busy {r['gpu_busy_ms']:.2f} "
            f"ms, CPU self {r['cpu_self_ms_total']:.2f} ms in {r['cpu_ops_per_step']:.0f} ops"
        )
        for op, ms, calls in r["top_cpu_self"]:
            print(f"  {ms:8.3f} ms {calls:6.0f}x  {op[:90]}")
    write_results(args.out, {"model": args.model, "results": results})


if __name__ == "__main__":
    main()
