"""Tune batch_norm_act on this GPU: where its time goes, and the fastest launch configuration of
each of its four kernels at ResNet-50's stage shapes (batch 256, bf16, channels_last, training,
residual, ReLU).

    python benchmarks/kernels/tune_batch_norm_act.py [--quick] [--shapes 256x1024x14x14]
                                                     [--workers 12] [--budget-s 170]
                                                     [--handover]

1. host: per call, the time the host takes to queue gpushape's fwd and fwd+bwd (N calls, no
   synchronisation: `host_us`) against the time they take to finish (`wall_us`), with the
   direct launcher and with Triton's JIT launch, and eager BatchNorm + add + ReLU alike. Where
   host_us > the GPU time, the host is the bottleneck.
2. checks (while a pool of worker processes compiles the sweep's kernels): the numeric gate of
   TESTING.md at batch 32; the direct launcher and the JIT give bit-identical results.
3. copy bandwidth (same run); torch.profiler's kernels and device time of one fwd+bwd.
4. kernels: GPU time of each kernel alone (CUDA events, the GPU kept busy by a spin kernel
   while the host queues, so launch overhead is excluded; median), the bytes it must move, GB/s
   and % of copy: at the default configuration, then over a grid (stage 1: channel block x
   tile x warps; stage 2: grid size, finalize and looping variants of the best three).
5. verify: the tuned configuration against the default one at full shape, the gate at batch
   32; default vs tuned fwd and fwd+bwd end to end, alternated (gpushape.bench.compare).
Writes $OUT/tune_batch_norm_act.json (default ./out); its "table" loads with
`bench_batch_norm_act.py --tuning FILE` and, for any run of gpushape, through
GPUSHAPE_BATCH_NORM_TUNING=FILE; the printed TUNED entries paste into
src/gpushape/kernels/batch_norm/_tuning.py. Prints the summary last.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tune_batch_norm_grid as grid
import _tune_batch_norm_measure as measure

from gpushape.bench import copy_bandwidth_bytes_per_s, write_results
from gpushape.kernels.batch_norm._tuning import DEFAULT, BatchNormTuning, tuning_for

# Furthest from the targets first: if the time budget runs out, the large shapes lose configs.
SHAPES = [(256, 1024, 14, 14), (256, 512, 28, 28), (256, 256, 56, 56), (256, 64, 112, 112)]
KINDS = ("stats", "apply", "bwd_reduce", "bwd_apply")


def _name(shape) -> str:
    return "x".join(map(str, shape))


def time_config(kind, shape, bufs, cfg, repeats, spin, copy_gbps) -> dict:
    fn = grid.runner(kind, bufs, grid.tuning_with(kind, cfg))
    ms, clean = measure.gpu_ms(fn, repeats, spin)
    gbps = grid.kernel_bytes(kind, shape) / ms / 1e6
    return dict(
        shape=list(shape),
        kernel=kind,
        config=dataclasses.asdict(cfg),
        ms=ms,
        gbps=gbps,
        pct_copy=gbps / copy_gbps,
        host_within_spin=clean,
    )


def sweep(kind, shape, bufs, cfgs, repeats, spin, copy_gbps, deadline, failed) -> list[dict]:
    """Time each configuration; configurations past the deadline, or that failed to compile
    or run (here or in a worker), get a row that says so instead."""
    rows = []
    for cfg in cfgs:
        row = dict(shape=list(shape), kernel=kind, config=dataclasses.asdict(cfg))
        error = failed.get(grid.job(shape, kind, cfg))
        if error:
            rows.append(dict(row, error=error))
        elif time.perf_counter() > deadline:
            rows.append(dict(row, skipped="time budget"))
        else:
            try:
                rows.append(time_config(kind, shape, bufs, cfg, repeats, spin, copy_gbps))
            except Exception as exc:  # a Triton compile error, out of resources, ...
                rows.append(dict(row, error=f"{type(exc).__name__}: {exc}"[:500]))
    return rows


def pool_results(pool, jobs: list, timeout_s: float) -> dict | None:
    """{job: error} of compiling `jobs` in the pool, or None when it did not finish in time
    (a lost worker: the timing process then compiles what it needs itself)."""
    import multiprocessing

    try:
        errors = pool.map_async(grid.compile_one, jobs, chunksize=1).get(timeout=timeout_s)
    except multiprocessing.TimeoutError:
        return None
    return {j: e for j, e in zip(jobs, errors) if e}


def best_of(rows: list[dict], k: int = 1) -> list[dict]:
    return sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])[:k]


def best_config(kind: str, rows: list[dict]):
    """The fastest timed configuration (the default when none was timed)."""
    best = best_of(rows)
    return grid.config_from(kind, best[0]["config"]) if best else getattr(DEFAULT, kind)


def fmt_cfg(kind: str, d: dict) -> str:
    default = dataclasses.asdict(getattr(DEFAULT, kind))
    changed = ", ".join(f"{k}={v!r}" for k, v in d.items() if default[k] != v)
    return f"{type(getattr(DEFAULT, kind)).__name__}({changed})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smaller grid, fewer repeats")
    parser.add_argument(
        "--shapes",
        default="",
        help="e.g. 256x1024x14x14 (default: ResNet-50's four stage shapes at batch 256)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=grid.default_workers(),
        help="compile processes (0: compile in this process)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=140.0,
        help="stop sweeping after this many seconds (verifying the winners takes about 20 s more)",
    )
    parser.add_argument(
        "--handover",
        action="store_true",
        help="the backward kernels with the gradient in two parts (ResNet's block outputs)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu only to smoke-test this script (TRITON_INTERPRET=1, tiny shapes)",
    )
    args = parser.parse_args(argv)
    grid.DEVICE, grid.HANDOVER = args.device, args.handover
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "tune_batch_norm_act: needs a CUDA GPU (or --device cpu to smoke-test)", file=sys.stderr
        )
        return 2
    start = time.perf_counter()
    shapes = (
        [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        if args.shapes
        else SHAPES
    )
    repeats = 6 if args.quick else 10
    torch.manual_seed(0)
    gate = measure.load_gate()
    stage1 = {(s, k): grid.stage1(k, s[1], args.quick) for s in shapes for k in KINDS}
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(args.workers) if args.workers else None
    jobs = [grid.job(s, k, c) for (s, k), cfgs in stage1.items() for c in cfgs]
    pending = pool.map_async(grid.compile_one, jobs, chunksize=1) if pool else None
    deadline = start + args.budget_s

    checks = {}
    for s in shapes:  # correctness first (this process compiles the default kernels)
        checks[_name(s)] = measure.check_gate(s, None, gate)
        print(f"check {_name(s)} (batch 32): {checks[_name(s)]}", flush=True)
    copy_gbps = (
        copy_bandwidth_bytes_per_s(2**30 if grid.DEVICE == "cuda" else 2**22, device=grid.DEVICE)
        / 1e9
    )
    spin = measure.spin_ms()
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s; spin kernel {spin:.3f} ms", flush=True)
    failed = {}
    if pending:
        try:
            failed = {
                j: e
                for j, e in zip(jobs, pending.get(timeout=max(deadline - time.perf_counter(), 30)))
                if e
            }
        except multiprocessing.TimeoutError:  # a lost worker: compile here as needed
            pool.terminate()
            pool = None
    print(
        f"stage 1: {len(jobs)} compile jobs, {len(failed)} failed, pool "
        f"{'ok' if pool else 'off'}, {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    host = [row for s in shapes for row in measure.measure_host(s)]  # the pool is idle now
    grid.empty_cache()

    rows, profiles = [], {}
    for s in shapes:  # stage 1
        bufs = grid.Buffers.make(s, fill=True)
        checks[f"{_name(s)} direct launcher == JIT"] = measure.fast_equals_jit(bufs)
        profiles[_name(s)] = measure.profile_step(bufs)
        for k in KINDS:
            rows += [
                dict(r, stage=1)
                for r in sweep(
                    k, s, bufs, stage1[(s, k)], repeats, spin, copy_gbps, deadline, failed
                )
            ]
        print(
            f"stage 1 {_name(s)}: {sum(len(stage1[(s, k)]) for k in KINDS)} configurations, "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )
        del bufs
        grid.empty_cache()

    def of(s, k):
        return [r for r in rows if tuple(r["shape"]) == s and r["kernel"] == k]

    stage2 = {
        (s, k): [
            c
            for c in grid.stage2(
                k, [grid.config_from(k, r["config"]) for r in best_of(of(s, k), 3)]
            )
            if c not in stage1[(s, k)]
        ]
        for s in shapes
        for k in KINDS
    }
    jobs2 = [grid.job(s, k, c) for (s, k), cfgs in stage2.items() for c in cfgs]
    if pool and time.perf_counter() < deadline:
        got = pool_results(pool, jobs2, max(deadline - time.perf_counter(), 20))
        failed.update(got or {})
        if got is None:
            pool.terminate()
            pool = None
    if pool:
        pool.close()
    print(f"stage 2: {len(jobs2)} configurations, {time.perf_counter() - start:.0f} s", flush=True)

    tuned, e2e = {}, {}
    for s in shapes:  # stage 2, then verify the winners
        bufs = grid.Buffers.make(s, fill=True)
        for k in KINDS:
            rows += [
                dict(r, stage=2)
                for r in sweep(
                    k, s, bufs, stage2[(s, k)], repeats, spin, copy_gbps, deadline, failed
                )
            ]
            timed = best_of(of(s, k))
            first = of(s, k)[0].get("ms", float("nan"))
            print(
                f"{_name(s)} {k:10s} default {first:.4f} ms -> best "
                f"{timed[0]['ms'] if timed else float('nan'):.4f} ms "
                f"{fmt_cfg(k, dataclasses.asdict(best_config(k, of(s, k))))}",
                flush=True,
            )
        tuned[s] = BatchNormTuning(**{k: best_config(k, of(s, k)) for k in KINDS})
        ref, got = measure.fwd_bwd(bufs), measure.fwd_bwd(bufs, tuned[s])
        checks[f"{_name(s)} tuned vs default (full shape)"] = all(
            torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2 * a.float().abs().max())
            for a, b in zip(ref, got)
        )
        checks[f"{_name(s)} tuned gate"] = measure.check_gate(s, tuned[s], gate)
        e2e[_name(s)] = measure.end_to_end(bufs, tuned[s], rounds=3 if args.quick else 5)
        del bufs
        grid.empty_cache()
    out = {"host": host, "compile_failures": [dict(job=str(j), error=e) for j, e in failed.items()]}

    table = [
        dict(C=s[1], rows=s[0] * s[2] * s[3], tuning=dataclasses.asdict(t))
        for s, t in tuned.items()
    ]
    out_dir = Path(os.environ.get("OUT", "out"))
    path = write_results(
        out_dir / "tune_batch_norm_act.json",
        rows,
        copy_bandwidth_gbps=copy_gbps,
        checks=checks,
        host=out["host"],
        profile=profiles,
        end_to_end=e2e,
        table=table,
        compile_failures=out["compile_failures"],
        elapsed_s=time.perf_counter() - start,
        timing=(
            f"kernels: CUDA events around one call queued behind a "
            f"{measure.SPIN_CYCLES}-cycle spin kernel (GPU time alone), median of {repeats}; "
            "end to end: "
            "gpushape.bench.compare, default and tuned alternated"
        ),
        bytes_counted="S = one bf16 (N, C, H, W) tensor, bits S/16: stats S, apply 3S + bits, "
        "bwd_reduce 2S + bits, bwd_apply 4S + bits",
    )
    print_summary(shapes, rows, out, e2e, tuned, copy_gbps, checks, path)
    return 0


def print_summary(shapes, rows, out, e2e, tuned, copy_gbps, checks, path) -> None:
    print(f"\nwrote {path}\ncopy bandwidth (same run): {copy_gbps:.0f} GB/s\n")
    print("host us per call (queue N calls; wall = until done):")
    for h in out["host"]:
        print(
            f"  {_name(h['shape']):>16s} {h['variant']:30s} host {h['host_us']:7.0f}  "
            f"wall {h['wall_us']:7.0f}"
        )
    print("\nkernel GPU ms alone (GB/s, % copy): default -> best [config]")
    for s in shapes:
        fwd = {"default": 0.0, "best": 0.0}
        total = dict(fwd)
        for k in KINDS:
            sel = [r for r in rows if tuple(r["shape"]) == s and r["kernel"] == k and "ms" in r]
            if not sel:
                continue
            default = dataclasses.asdict(getattr(DEFAULT, k))
            d = next((r for r in sel if r["config"] == default), sel[0])
            b = min(sel, key=lambda r: r["ms"])
            for key, r in (("default", d), ("best", b)):
                total[key] += r["ms"]
                fwd[key] += r["ms"] if k in ("stats", "apply") else 0.0
            print(
                f"  {_name(s):>16s} {k:10s} {d['ms']:.4f} ({d['gbps']:5.0f}, "
                f"{100 * d['pct_copy']:3.0f}%) -> {b['ms']:.4f} ({b['gbps']:5.0f}, "
                f"{100 * b['pct_copy']:3.0f}%) {fmt_cfg(k, b['config'])}"
            )
        print(
            f"  {_name(s):>16s} sum: fwd {fwd['default']:.3f} -> {fwd['best']:.3f} ms, "
            f"fwd+bwd {total['default']:.3f} -> {total['best']:.3f} ms (kernels alone)"
        )
        for r in e2e.get(_name(s), []):
            print(
                f"  {_name(s):>16s} end to end {r['direction']:8s} default "
                f"{r['default_ms']:.3f} ms, tuned {r['tuned_ms']:.3f} ms"
            )
    print("\nchecks:")
    for name, verdict in checks.items():
        print(f"  {name}: {verdict}")
    print(
        "\nTUNED entries for src/gpushape/kernels/batch_norm/_tuning.py "
        "(or: bench_batch_norm_act.py --tuning the JSON above):"
    )
    for s, t in tuned.items():
        inner = ", ".join(f"{k}={fmt_cfg(k, dataclasses.asdict(getattr(t, k)))}" for k in KINDS)
        print(f"    ({s[1]}, {s[0] * s[2] * s[3]}): BatchNormTuning({inner}),")
    current = {s: tuning_for(s[1], s[0] * s[2] * s[3], True) for s in shapes}
    print(
        f"(table entries in effect before this run: {sum(c != DEFAULT for c in current.values())}"
        f" of {len(shapes)} shapes)"
    )


if __name__ == "__main__":
    sys.exit(main())
