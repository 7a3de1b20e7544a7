"""What the kernel benchmarks share: the tests' numeric gate, the `--device` / `--shapes`
options (and the whole command line of the shape-by-variant ones), the same-run copy
bandwidth, one timing row's figures, and CUDA-graph replay (GPU time without the host's
launch and autograd cost)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.bench import Timing, copy_bandwidth_bytes_per_s, cuda_graph  # noqa: E402


def load_numeric():
    """The tests' numeric module (tests/kernel_ops/_numeric.py): one rule for tests and
    benchmarks. Loaded by path, so no other installed package named `tests` can stand in for
    it."""
    path = ROOT / "tests" / "kernel_ops" / "_numeric.py"
    spec = importlib.util.spec_from_file_location("gpushape_tests_numeric", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def load_gate() -> Callable:
    """The numeric gate of the tests (`gate_forward_backward`)."""
    return load_numeric().gate_forward_backward


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu only to smoke-test this script (TRITON_INTERPRET=1, tiny shapes)",
    )


@dataclass(frozen=True)
class RunArgs:
    """What a shape-by-variant kernel benchmark's command line gives (`variant_run_args`)."""

    args: argparse.Namespace
    variants: list[str]
    rounds: int
    repeats: int
    out: Path


def variant_run_args(
    doc: str, script: str, variants: Sequence[str], shapes_help: str, argv: list[str] | None
) -> RunArgs:
    """The command line of bench_max_pool.py and bench_grn.py: --quick, --shapes (left as
    text: the script parses it), --variants (checked against `variants`), --out (default
    $OUT/<script>.json, OUT defaulting to ./out) and --device."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and repeats")
    parser.add_argument("--shapes", default="", help=shapes_help)
    parser.add_argument("--variants", default=",".join(variants), help=f"subset of {variants}")
    parser.add_argument("--out", default="", help=f"result JSON (default $OUT/{script}.json)")
    add_device_arg(parser)
    args = parser.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(variants))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(variants)}")
    rounds, repeats = (3, 5) if args.quick else (5, 20)
    out = Path(args.out) if args.out else Path(os.environ.get("OUT", "out")) / f"{script}.json"
    return RunArgs(args, names, rounds, repeats, out)


def shape_key(shape: Sequence[int], layout: str) -> str:
    """(256, 64, 112, 112), "cl" -> "256x64x112x112:cl"."""
    return f"{'x'.join(map(str, shape))}:{layout}"


def check_each(shapes: Sequence[tuple], check: Callable, device: str) -> dict[str, Any]:
    """`check(shape, layout, device)` at every (shape, layout), before any timing, printed as
    it goes: {shape_key: its result}."""
    checks = {}
    for shape, layout in shapes:
        key = shape_key(shape, layout)
        checks[key] = check(shape, layout, device)
        print(f"check {key}: {checks[key]}", flush=True)
    return checks


def time_each(shapes: Sequence[tuple], time_shape: Callable, device: str) -> list[Any]:
    """`time_shape(shape, layout)` at every (shape, layout) in turn, printed as it goes, the
    CUDA caching allocator emptied between shapes: their results in order."""
    out = []
    for shape, layout in shapes:
        out.append(time_shape(shape, layout))
        print(f"timed {shape_key(shape, layout)}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """ "8192x4096,1024x768" -> [(8192, 4096), (1024, 768)]."""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


def cuda_missing(device: str, script: str) -> bool:
    """True (and says so on stderr) when the script is asked for a GPU this machine lacks."""
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU (or --device cpu to smoke-test)", file=sys.stderr)
        return True
    return False


def measure_copy_gbps(device: str) -> float:
    """Device copy bandwidth in this run (1 GiB on the GPU, 4 MiB on a CPU smoke test)."""
    copy_gbps = (
        copy_bandwidth_bytes_per_s(2**30 if device == "cuda" else 2**22, device=device) / 1e9
    )
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s", flush=True)
    return copy_gbps


def timing_figures(t: Timing, min_bytes: float) -> dict:
    """One result row's timing columns: milliseconds, samples, method, and GB/s of min_bytes."""
    return dict(
        median_ms=t.median_s * 1e3,
        p10_ms=t.p10_s * 1e3,
        p90_ms=t.p90_s * 1e3,
        repeats=t.repeats,
        method=t.method,
        min_bytes=min_bytes,
        gbps=min_bytes / t.median_s / 1e9,
    )


def add_pct_copy(rows: list[dict], copy_gbps: float) -> None:
    for r in rows:
        r["pct_copy"] = r["gbps"] / copy_gbps


def graphed(fn: Callable[[], object], device: str) -> Callable[[], object] | None:
    """fn's CUDA-graph replay (gpushape.bench.cuda_graph), or None (and says why) when fn cannot
    be captured. On the CPU, fn itself."""
    if device != "cuda":
        return fn
    try:
        return cuda_graph(fn)
    except Exception as exc:  # a variant that cannot be captured is reported, not fatal
        torch.cuda.synchronize()
        print(
            f"  (not captured in a CUDA graph: {type(exc).__name__}: {str(exc)[:120]})", flush=True
        )
        return None


def host_and_wall_us(
    fn: Callable[[], object], calls: int = 50, warmup: int = 1
) -> tuple[float, float]:
    """(host, wall) microseconds per call of `fn` queued `calls` times without synchronising:
    what the CPU pays to queue it, and when the GPU is done. host >= the GPU time: host-bound."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return host / calls * 1e6, wall / calls * 1e6
