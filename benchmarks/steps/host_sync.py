"""Why is an eager step slower than both its host and its GPU? For each variant of `gpushape
bench`: the places in one step that make the host wait for the GPU (CUDA's sync debug mode,
with the Python stack that called them), the time the host spends waiting in CUDA runtime calls
(torch.profiler), the GPU's busy time, and its idle gaps with the CPU op that was running.

    python benchmarks/steps/host_sync.py hf:bert --batch 32 --vs eager,optimize --out $OUT/h.json
"""

from __future__ import annotations

import sys
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from _variants import each_variant, parser, wall_then_profiled

from gpushape.bench import write_results

STEPS = 5
WAITS = ("Synchronize", "cudaMemcpy", "cudaStreamWait", "cudaEventSynchronize", "cudaFree")


def sync_sites(run) -> list[dict]:
    """Where one step synchronises: each site once, with how often and the stack below it."""
    sites: Counter = Counter()
    stacks: dict[str, str] = {}

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-2] if "warnings" not in f.filename]
        key = f"{filename}:{lineno}"
        sites[key] += 1
        stacks.setdefault(key, "".join(traceback.format_list(frames[-8:])))

    torch.cuda.synchronize()
    old = warnings.showwarning
    warnings.showwarning = show
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = old
    torch.cuda.synchronize()
    return [{"site": k, "count": n, "stack": stacks[k]} for k, n in sites.most_common()]


def timeline(run, steps: int = STEPS) -> dict:
    wall, prof = wall_then_profiled(run, steps)
    kernels, waits, cpu_ops = [], defaultdict(float), []
    for e in prof.events():
        start, end = e.time_range.start, e.time_range.end
        if e.device_type.name == "CUDA":
            kernels.append((start, end))
        elif any(w in e.name for w in WAITS):
            waits[e.name] += (end - start) / 1e3
        elif e.name.startswith("aten::") or "Backward" in e.name or "step" in e.name:
            cpu_ops.append((start, end, e.name))
    kernels.sort()
    busy, gaps, cursor = 0.0, [], None
    for start, end in kernels:
        if cursor is not None and start > cursor:
            gaps.append((start - cursor, cursor, start))
        cursor = end if cursor is None else max(cursor, end)
    if kernels:
        first = kernels[0][0]
        busy = (cursor - first - sum(g[0] for g in gaps)) / 1e3
    by_op, by_phase = _idle_by_op(gaps, cpu_ops)
    gaps.sort(reverse=True)
    top_gaps = []
    for length, lo, hi in gaps[:12]:
        during = [n for s, e, n in cpu_ops if s <= hi and e >= lo]
        top_gaps.append({"us": length, "cpu_ops": Counter(during).most_common(4)})
    return {
        "wall_ms": wall * 1e3,
        "gpu_busy_ms": busy / steps,
        "gpu_idle_ms": sum(g[0] for g in gaps) / 1e3 / steps,
        "gaps_over_50us_per_step": sum(1 for g in gaps if g[0] > 50) / steps,
        "host_wait_ms": {k: v / steps for k, v in sorted(waits.items(), key=lambda kv: -kv[1])},
        "top_gaps": top_gaps,
        "idle_by_phase_ms": {k: v / 1e3 / steps for k, v in by_phase.most_common()},
        "idle_by_op_ms": {k: v / 1e3 / steps for k, v in by_op.most_common(15)},
    }


def _phase(name: str) -> str:
    if "Optimizer" in name or name.endswith(".step") or "_foreach" in name:
        return "optimizer"
    return "backward" if "Backward" in name or "backward" in name else "forward"


def _idle_by_op(gaps: list, cpu_ops: list) -> tuple[Counter, Counter]:
    """Idle microseconds by the outermost CPU op running when each gap began (the op the
    host was busy with while the GPU waited), and by phase (forward, backward, optimizer)."""
    ops = sorted(cpu_ops)
    by_op: Counter = Counter()
    by_phase: Counter = Counter()
    for length, lo, _hi in gaps:
        during = [(s, e, n) for s, e, n in ops if s <= lo <= e]
        if during:
            outer = min(during, key=lambda o: o[0])[2]
            inner = max(during, key=lambda o: o[0])[2]
            by_op[f"{outer} > {inner}" if outer != inner else outer] += length
            by_phase[_phase(" ".join(n for _s, _e, n in during))] += length
        else:
            by_op["(no op)"] += length
            by_phase["between ops"] += length
    return by_op, by_phase


def main() -> None:
    args = parser("host_sync.json", optimizer="adamw-fused").parse_args()
    results = {}
    for name, variant in each_variant(args):
        for _ in range(3):
            variant.run()
        sites = sync_sites(variant.run)
        r = timeline(variant.run)
        results[name] = {"sync_sites": sites, **r}
        print(
            f"== {name}: wall {r['wall_ms']:.2f} ms, GPU busy {r['gpu_busy_ms']:.2f} ms, "
            f"idle {r['gpu_idle_ms']:.2f} ms, {len(sites)} sync site(s)"
        )
        for s in sites:
            print(f"  sync x{s['count']} at {s['site']}\n{s['stack']}")
        for k, v in list(r["host_wait_ms"].items())[:6]:
            print(f"  host waits {v:8.3f} ms in {k}")
        print(
            "  idle by phase: "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in r["idle_by_phase_ms"].items())
        )
        for k, v in list(r["idle_by_op_ms"].items())[:10]:
            print(f"  idle {v:7.3f} ms while host in {k}")
        for g in r["top_gaps"][:6]:
            print(f"  gap {g['us']:8.0f} us during {g['cpu_ops']}")
    write_results(args.out, {"model": args.model, "batch": args.batch, "results": results})


if __name__ == "__main__":
    main()
