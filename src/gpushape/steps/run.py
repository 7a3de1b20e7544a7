"""`bench()`: a model's training step, as given and as variants, measured in one process.

    result = bench(model, example_inputs, variants=["compile", "optimize+graph"])
    result.table()          # median step, samples/s, ratio to the baseline, MFU, bound

Each variant is built (its warm-up timed: compile, capture, autotuning), then all are timed
together in alternating rounds (`measure.time_blocks`), then each is profiled once for its
kernels, GPU busy time and peak memory. Profiling comes last on purpose: a finished
torch.profiler session can leave CUPTI attached and every later launch slower
(pytorch/pytorch#144455), which an eager step would pay in its timing. FLOPs come from
gpushape's trace of the model as given (forward and backward; the optimizer's few FLOPs not
counted), so MFU is model FLOPs per second over the chip's dense datasheet peak for the model's
dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..bench import environment
from ..errors import GpushapeError
from .batch import Batch, synthetic_batch
from .compiling import room_to_compile
from .loss_check import LossCurve, LossVerdict, compare, loss_curves
from .measure import (
    StepStats,
    held_issue_time,
    issue_time,
    kernel_profile,
    peak_memory,
    time_blocks,
    warm,
)
from .variants import Spec, Variant, build_variant, parse_variant


@dataclass
class BenchResult:
    model: str
    baseline: str
    task: str
    batch_shapes: list[str]
    stats: dict[str, StepStats]
    notes: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    """Variants that could not be built or run, with the reason (the others still ran)."""
    env: dict[str, Any] = field(default_factory=environment)
    optimize_reports: dict[str, Any] = field(default_factory=dict, repr=False)
    loss_curves: dict[str, LossCurve] = field(default_factory=dict)
    """`loss_steps` steps of each variant from the model's weights (empty when not asked)."""
    loss_failed: dict[str, str] = field(default_factory=dict)
    loss_steps: int = 0

    def loss_verdicts(self) -> dict[str, LossVerdict]:
        if self.baseline not in self.loss_curves:
            return {}
        return compare(self.loss_curves, self.baseline)

    def ratio(self, variant: str) -> float:
        """How many times faster than the baseline (step time ratio)."""
        return self.stats[self.baseline].median_s / self.stats[variant].median_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.env,
            "model": self.model,
            "baseline": self.baseline,
            "task": self.task,
            "batch": self.batch_shapes,
            "variants": {
                name: {**s.to_dict(), "speedup_vs_baseline": self.ratio(name)}
                for name, s in self.stats.items()
            },
            "notes": self.notes,
            "failed": self.failed,
            "optimize": {k: r.to_dict() for k, r in self.optimize_reports.items()},
            **(
                {
                    "loss_check": {
                        "steps": self.loss_steps,
                        "curves": {
                            n: {"start": c.start, "losses": list(c.losses)}
                            for n, c in self.loss_curves.items()
                        },
                        "verdicts": {n: v.to_dict() for n, v in self.loss_verdicts().items()},
                        "failed": self.loss_failed,
                    }
                }
                if self.loss_curves
                else {}
            ),
        }


def _shapes(batch: Batch) -> list[str]:
    out = []
    for t in batch.inputs:
        if isinstance(t, torch.Tensor):
            out.append("x".join(map(str, t.shape)) + f":{str(t.dtype).removeprefix('torch.')}")
    return out


def model_flops(model: nn.Module, inputs: tuple) -> float | None:
    """FLOPs of a training step's forward and backward, from gpushape's meta trace (with the
    labels a library model's own loss reads, as the audit traces it)."""
    from ..models.labels import with_labels
    from ..tracing.cost import cost
    from ..tracing.tracer import trace

    try:
        traced = trace(model, with_labels(model, inputs), train=True)
        return float(cost(traced, "h100").totals.flops)
    except Exception:  # a model the tracer cannot follow still benchmarks; MFU is left out
        return None


def _chip(model: nn.Module, gpu: Any) -> Any:
    """The chip the step runs on, calibrated where a profile measured it: a resolved target's
    spec (the CLI's: the bundled profile or --profile), else the named or current chip with
    the profile shipped for it; None for a step not on a GPU."""
    from ..hardware import calibrated, current_gpu, get_gpu

    if not any(p.is_cuda for p in model.parameters()):
        return None  # MFU of a GPU's peak means nothing for a step run elsewhere
    spec = getattr(gpu, "spec", None)
    if spec is not None:
        return spec
    spec = get_gpu(gpu) if gpu is not None else current_gpu()
    return calibrated(spec) if spec is not None else None


def _dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def dense_peak(model: nn.Module, gpu: Any) -> float | None:
    """The chip's datasheet dense peak for the model's dtype."""
    spec = _chip(model, gpu)
    return None if spec is None else spec.peak_flops(_dtype(model))


def measured_peak(model: nn.Module, gpu: Any) -> float | None:
    """The largest aligned GEMM's measured rate for the model's dtype, where the chip's
    profile measured it (`gpushape probe`: 767 TFLOP/s in bf16 on the H200, against 989 on
    its datasheet), else None."""
    spec = _chip(model, gpu)
    if spec is None or "gemm_fraction" not in spec.achievable.measured:
        return None
    return spec.attainable_flops(_dtype(model))


def measure_variants(
    specs: Mapping[str, Spec],
    model: nn.Module,
    batch: Batch,
    *,
    optimizer: str,
    gpu: Any,
    rounds: int,
    block: int,
    warmup: int,
    profile: bool = True,
    progress: Callable[[str], None] = lambda _: None,
    settled: Callable[[dict[str, list[float]]], bool] | None = None,
    max_rounds: int | None = None,
) -> tuple[dict[str, Variant], dict[str, StepStats], dict[str, str]]:
    """Build each variant (the first one must build: it is the baseline), warm it up, time them
    all together and profile each: (the variants, their figures, why the others failed)."""
    cuda = any(p.is_cuda for p in model.parameters())
    flops, peak = model_flops(model, batch.inputs), dense_peak(model, gpu)
    measured = measured_peak(model, gpu)
    built: dict[str, Variant] = {}
    warmups: dict[str, float] = {}
    memory: dict[str, int | None] = {}
    failed: dict[str, str] = {}
    for i, (name, spec) in enumerate(specs.items()):
        progress(f"building and warming up {name}")
        try:
            with peak_memory(cuda) as peaks:
                variant = build_variant(name, model, batch, optimizer=optimizer, gpu=gpu, spec=spec)
                if cuda:  # what the build holds counts, its passing copies (optimize's checks) not
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                warmups[name] = variant.build_s + warm(variant.run, warmup, cuda=cuda)
            built[name], memory[name] = variant, peaks.get("bytes")
        except Exception as exc:  # a variant that breaks is reported, the rest still run
            if i == 0:
                if isinstance(exc, GpushapeError):
                    raise
                msg = f"the baseline {name!r} failed: {type(exc).__name__}: {exc}"
                raise GpushapeError(msg) from exc
            failed[name] = (
                str(exc)
                if isinstance(exc, GpushapeError)
                else f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            )
    progress(f"timing {len(built)} variant(s): {rounds} rounds of {block} steps")
    runs = {name: v.run for name, v in built.items()}
    times = time_blocks(
        runs, rounds=rounds, block=block, cuda=cuda, settled=settled, max_rounds=max_rounds
    )
    ran = len(next(iter(times.values()), []))
    if ran > rounds:
        progress(f"timed {ran} rounds: {ran - rounds} more to settle the differences")
    # every variant's host issue time before any profiler runs in the process (a profiler
    # session may leave the host's dispatch slower for what follows it)
    issues = {name: issue_time(v.run, cuda=cuda) if profile else None for name, v in built.items()}
    hosts = {
        name: held_issue_time(v.run, cuda=cuda) if profile else None for name, v in built.items()
    }
    stats = {}
    for name, variant in built.items():
        kernels, busy, top = kernel_profile(variant.run, cuda=cuda) if profile else (None, None, ())
        issue = issues[name]
        stats[name] = StepStats(
            variant=name,
            step_times_s=tuple(times[name]),
            warmup_s=warmups[name],
            samples=batch.samples,
            tokens=batch.tokens,
            peak_memory_bytes=memory[name],
            kernels=kernels,
            gpu_busy_s=busy,
            top_kernels=top,
            issue_s=issue,
            host_s=hosts[name],
            flops=flops,
            peak_flops=peak,
            measured_peak_flops=measured,
            variant_flops=_own_flops(variant, specs[name], flops),
        )
    return built, stats, failed


def _own_flops(variant: Variant, spec: Spec, given: float | None) -> float | None:
    """A variant's own FLOPs a step: its rewritten model traced, the model's as given where it
    runs the same model (a runner or the optimizer changes no FLOP)."""
    if not (spec.channels_last or spec.optimize_mode):
        return given
    return model_flops(variant.step.model, variant.step.batch.inputs)


def bench(
    model: nn.Module,
    example_inputs: Any,
    *,
    variants: Sequence[str] = (),
    baseline: str = "eager",
    name: str | None = None,
    optimizer: str = "auto",
    rounds: int = 5,
    block: int = 10,
    warmup: int = 3,
    gpu: Any = None,
    profile: bool = True,
    progress: Callable[[str], None] | None = None,
    loss_steps: int = 0,
) -> BenchResult:
    """Time `baseline` and every variant of `model`'s training step in one process. With
    `loss_steps`, each first trains that many steps from the model's weights on the fixed
    batch, and its loss curve is compared with the baseline's (steps/loss_check.py)."""
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    names = [baseline, *[v for v in variants if v != baseline]]
    for v in names:
        parse_variant(v)
    if any(p.is_meta for p in model.parameters()):
        raise GpushapeError("bench runs the model: build it on cpu or cuda, not meta")
    say = progress or (lambda _: None)
    batch = synthetic_batch(model, inputs)
    specs = {v: Spec.of(v) for v in names}
    curves, curves_failed = {}, {}
    with room_to_compile(specs.values(), builds_each=2 if loss_steps else 1):
        if loss_steps:
            curves, curves_failed = loss_curves(
                specs, model, batch, steps=loss_steps, optimizer=optimizer, gpu=gpu, progress=say
            )
        built, stats, failed = measure_variants(
            specs,
            model,
            batch,
            optimizer=optimizer,
            gpu=gpu,
            rounds=rounds,
            block=block,
            warmup=warmup,
            profile=profile,
            progress=say,
        )
    return BenchResult(
        model=name or type(model).__name__,
        baseline=baseline,
        task=batch.task,
        batch_shapes=_shapes(batch),
        stats=stats,
        notes={v: b.notes for v, b in built.items() if b.notes},
        failed=failed,
        optimize_reports={v: b.optimize_report for v, b in built.items() if b.optimize_report},
        loss_curves=curves,
        loss_failed=curves_failed,
        loss_steps=loss_steps,
    )
