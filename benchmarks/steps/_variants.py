"""What the host studies share: the command line (a MODEL, --vs, --batch, --optimizer, --out),
each named variant of `gpushape bench` built on the GPU, one at a time, and a step's wall clock
unprofiled followed by torch.profiler over as many steps."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.models import resolve_model
from gpushape.steps import synthetic_batch
from gpushape.steps.variants import Spec, Variant, build_variant


def parser(out: str, optimizer: str = "auto") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--vs", default="eager,optimize")
    p.add_argument("--batch", type=int)
    p.add_argument(
        "--input", action="append", help="an input shape, e.g. 256x3x224x224 (repeatable)"
    )
    p.add_argument("--optimizer", default=optimizer)
    p.add_argument("--out", default=out)
    return p


def each_variant(args: argparse.Namespace) -> Iterator[tuple[str, Variant]]:
    """(name, variant) for each of --vs, built from the model at --batch in bf16 on CUDA; the
    previous one is dropped and the cache emptied before the next is built."""
    resolved = resolve_model(
        args.model,
        batch=args.batch,
        dtype=torch.bfloat16,
        device="cuda",
        inputs=getattr(args, "input", None),
    )
    batch = synthetic_batch(resolved.model, resolved.example_inputs)
    for name in args.vs.split(","):
        variant = build_variant(
            name, resolved.model, batch, optimizer=args.optimizer, spec=Spec.of(name)
        )
        yield name, variant
        del variant
        torch.cuda.empty_cache()


def wall_then_profiled(run, steps: int) -> tuple[float, profile]:
    """(seconds per step unprofiled, torch.profiler over `steps` more with CPU and CUDA
    activities), after three warm-up steps."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    return wall, prof
