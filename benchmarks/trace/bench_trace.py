"""How long tracing takes, and how much memory, on this machine's CPU (no GPU needed).

Cases, each run in a fresh Python process so that its peak RSS and its first-call costs are
its own (median of --repeats processes):
- resnet50-train: ResNet-50, batch 1, 3x224x224, forward + backward on the meta device;
- llama7b-forward: LLaMA-7B, batch 1, sequence 2048, forward on the meta device;
- audit-demo: `gpushape audit resnet50 --gpu h100` end to end (what `make demo` runs).
Per case: seconds to import gpushape + torch, to build the model, for the first trace (which
pays PyTorch's one-time lazy imports of its Python meta kernels: torch._dynamo, ~1.7 s here),
for a second trace in the same process (warm), and peak resident memory (ru_maxrss). Wall
times go with CPU times (process_time) and the load average: on a shared machine the CPU time
is the figure that does not depend on the neighbours.

    python benchmarks/trace/bench_trace.py [--repeats 3] [--out benchmarks/results/...json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "resnet50-train": ("resnet50", {"batch": 1}, True),
    "llama7b-forward": ("llama-7b", {"batch": 1, "seq_len": 2048}, False),
}
LIMITS_S = {"resnet50-train": 3.0, "llama7b-forward": 30.0, "audit-demo": 10.0}
LIMIT_RSS_MB = {"llama7b-forward": 2048}


def child(case: str) -> dict:
    """Run one case in this process and return its timings."""
    t0, c0 = time.perf_counter(), time.process_time()
    import gpushape
    from gpushape.models import create_model

    t1, c1 = time.perf_counter(), time.process_time()
    name, options, train = CASES[case]
    model, inputs = create_model(name, **options)
    t2, c2 = time.perf_counter(), time.process_time()
    trace = gpushape.trace(model, inputs, train=train)
    t3, c3 = time.perf_counter(), time.process_time()
    gpushape.trace(model, inputs, train=train)
    t4, c4 = time.perf_counter(), time.process_time()
    report = gpushape.cost(trace, "h100", math="bf16")
    t5 = time.perf_counter()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {
        "import_s": t1 - t0,
        "build_s": t2 - t1,
        "trace_first_s": t3 - t2,
        "trace_warm_s": t4 - t3,
        "cost_s": t5 - t4,
        "import_cpu_s": c1 - c0,
        "build_cpu_s": c2 - c1,
        "trace_first_cpu_s": c3 - c2,
        "trace_warm_cpu_s": c4 - c3,
        "ops": len(trace.ops),
        "gemm_macs": report.totals.gemm_flops // 2,
        "peak_rss_mb": rss_mb,
        "load_average_1min": os.getloadavg()[0],
    }


def _run_child(case: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", case], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _run_demo() -> dict:
    exe = Path(sys.executable).with_name("gpushape")
    cmd = [str(exe), "audit", "resnet50", "--gpu", "h100"]
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": cpu_s,
        "command": " ".join(cmd[1:]),
        "load_average_1min": os.getloadavg()[0],
    }


def _median(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {**runs[0], **{k: statistics.median(r[k] for r in runs) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=f"benchmarks/results/trace-cpu-{dt.date.today()}.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    results = {}
    for case in CASES:
        runs = [_run_child(case) for _ in range(args.repeats)]
        results[case] = {"median": _median(runs), "runs": runs}
    demo = [_run_demo() for _ in range(args.repeats)]
    results["audit-demo"] = {"median": _median(demo), "runs": demo}

    from gpushape.bench import write_results

    write_results(
        args.out,
        results,
        method=f"median of {args.repeats} fresh processes; "
        "perf_counter; peak RSS from getrusage ru_maxrss",
        limits_s=LIMITS_S,
        limits_rss_mb=LIMIT_RSS_MB,
    )
    print("seconds, median of fresh processes (CPU seconds in brackets); load = 1-min average")
    print(
        f"{'case':<16}{'import':>13}{'build':>7}{'trace (first)':>16}{'trace (warm)':>15}"
        f"{'end to end':>13}{'RSS MB':>8}{'limit':>7}{'load':>6}"
    )
    for case, res in results.items():
        m = res["median"]
        print(
            f"{case:<16}{_pair(m, 'import'):>13}{m.get('build_s', 0):>7.2f}"
            f"{_pair(m, 'trace_first'):>16}{_pair(m, 'trace_warm'):>15}"
            f"{_pair(m, '', 'wall_s', 'cpu_s'):>13}{m.get('peak_rss_mb', 0):>8.0f}"
            f"{LIMITS_S[case]:>6.0f}s{m['load_average_1min']:>6.1f}"
        )
    print(f"wrote {args.out}")


def _pair(m: dict, stem: str, wall: str = "", cpu: str = "") -> str:
    wall, cpu = wall or f"{stem}_s", cpu or f"{stem}_cpu_s"
    if wall not in m:
        return "-"
    return f"{m[wall]:.2f} ({m[cpu]:.2f})"


if __name__ == "__main__":
    main()
