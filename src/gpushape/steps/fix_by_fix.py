"""The loop: audit, optimize, measure; each fix's predicted saving beside its measured one.

    result = loop(model, example_inputs, mode="eager")
    for row in result.rows: print(row.fix, row.predicted_wall_s, row.measured_wall_s)

1. The model is audited at the benchmark's batch, in the mode it will run, with the step's
   optimizer (so optimizer-not-fused can fire): the findings name the fixes.
2. `gpushape.optimize` runs on a copy to learn which of those fixes apply here (each checked
   numerically, failures rolled back).
3. Stages are built cumulatively, in the order optimize applies them: the model as given, then
   + the first applied transform, + the second, ..., then the fixes of high or medium
   findings that optimize rolled back as predicted slower (`disputed`: the timing settles
   it), then the step-level fixes the findings
   name (fused-optimizer; cuda-graphs: the step in one CUDA graph in eager mode,
   torch.compile's reduce-overhead mode in compile mode). graph-layers, where optimize kept it,
   comes first: it changes the host's cost, not the GPU's work, so the fixes after it are
   timed where their GPU savings reach the wall clock. In compile mode every stage runs under
   torch.compile. All stages are timed in one process, alternating (`run.bench`'s machinery).
4. A fix's measured saving is the step time of the stage before it minus its own; its GPU
   saving the same difference of GPU busy time (torch.profiler). Fixes interact, so a fix is
   measured on top of the ones before it, as a user applies them, and predicted the same way:
   the audit of each stage's model predicts its step (GPU time and wall clock in the mode),
   and a fix's predicted saving is the difference from the stage before (`loop_predict.py`).
   Every stage is audited with the step's optimizer, whose foreach Python an eager host pays; the
   optimizer's fix is priced by its finding in the last audited stage (the audit traces a
   library model with labels, so masked-lm-head's stage is audited like any other); a CUDA
   graph, and graph-layers, which optimize keeps on a timing of the layers
   rather than on a finding, by the audit's graph mode. A compiled stage's host is the step's
   as given less the kernels its fixes removed, each at the step's host cost per kernel
   (`auditing.modes.compiled_stage`). A cost
   the eager trace does not have (the all-true mask transformers builds while compiling,
   which skip-attention-mask removes) is in each stage's audited step in that mode
   (`evidence["cost_in_mode_s"]`), so its fix is priced like any other.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ..errors import GpushapeError
from .batch import synthetic_batch
from .compiling import room_to_compile
from .host_here import host_scale, scaled_target
from .loop_plan import applied_count, disputed, left_out, places
from .loop_plan import applied_order as _applied_order
from .loop_predict import GIVEN, expected_steps, model_dtype, predictions
from .measure import StepStats
from .run import measure_variants
from .step import make_optimizer
from .variants import Spec, Variant, build_variant

STEP_FIXES = ("fused-optimizer", "cuda-graphs")


@dataclass
class FixRow:
    fix: str
    stage: str
    places: int
    predicted_gpu_s: float
    predicted_wall_s: float
    measured_wall_s: float | None = None
    measured_gpu_s: float | None = None
    findings: list[str] = field(default_factory=list)
    measured_rounds_s: list[float] = field(default_factory=list)
    """The saving of each round (the stages alternate, so round i of the stage before and
    round i of this one ran side by side)."""
    predicted_here_wall_s: float | None = None
    """The wall saving predicted with the host's rates scaled to this host (host_here.py)."""

    @property
    def measured_spread_s(self) -> tuple[float, float] | None:
        """The lowest and highest saving of a single round."""
        r = self.measured_rounds_s
        return (min(r), max(r)) if len(r) > 1 else None

    @property
    def within_noise(self) -> bool:
        """The rounds do not settle the saving's sign (`sign_settled`)."""
        return len(self.measured_rounds_s) > 1 and not sign_settled(self.measured_rounds_s)

    @property
    def ratio(self) -> float | None:
        """Predicted / measured wall saving (None when the measured saving is not positive)."""
        if self.measured_wall_s is None or self.measured_wall_s <= 0:
            return None
        return self.predicted_wall_s / self.measured_wall_s

    @property
    def ratio_here(self) -> float | None:
        """The same with the prediction on this host's rates."""
        ok = self.predicted_here_wall_s is not None and (self.measured_wall_s or 0) > 0
        return self.predicted_here_wall_s / self.measured_wall_s if ok else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "measured_spread_s": self.measured_spread_s,
            "ratio": self.ratio,
            "ratio_here": self.ratio_here,
            "within_noise": self.within_noise,
        }


@dataclass
class LoopResult:
    model: str
    mode: str
    stages: dict[str, StepStats]
    rows: list[FixRow]
    predicted_step_s: float
    audit: Any = field(repr=False, default=None)
    optimize_report: Any = field(repr=False, default=None)
    failed: dict[str, str] = field(default_factory=dict)
    host_scale: float | None = None
    """This host's issue time of the step as given over the audit's (host_here.py)."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Fixes of high or medium findings the loop does not time, and why: what the planning
    copy's optimize refused, rolled back or skipped for them."""
    expected: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Each stage's predicted step (GPU seconds, wall seconds): the rows' savings are their
    differences."""

    @property
    def speedup(self) -> float:
        last = list(self.stages.values())[-1]
        return self.stages[GIVEN].median_s / last.median_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mode": self.mode,
            "predicted_step_s": self.predicted_step_s,
            "stages": {k: s.to_dict() for k, s in self.stages.items()},
            "fixes": [r.to_dict() for r in self.rows],
            "speedup": self.speedup,
            "host_scale": self.host_scale,
            "failed": self.failed,
            "left_out": self.left_out,
            "predicted_stages": {
                k: {"gpu_s": g, "wall_s": w} for k, (g, w) in self.expected.items()
            },
            "optimize": self.optimize_report.to_dict() if self.optimize_report else None,
        }


def loop(
    model: nn.Module,
    example_inputs: Any,
    *,
    mode: str = "eager",
    gpu: Any = None,
    name: str | None = None,
    optimizer: str = "auto",
    rounds: int = 5,
    block: int = 10,
    warmup: int = 3,
    progress: Any = None,
) -> LoopResult:
    """Audit, optimize and measure `model`'s training step, fix by fix (module docstring)."""
    from ..auditing.api import audit

    if mode not in ("eager", "compile"):
        raise GpushapeError(f"the loop runs eager or compile mode, not {mode!r}")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    say = progress or (lambda _: None)
    batch = synthetic_batch(model, inputs)
    say("auditing at the benchmark's batch")
    report = audit(
        model,
        inputs,
        gpu,
        dtype=model_dtype(model),
        train=True,
        optimizer=make_optimizer(model, batch, optimizer),  # read, never stepped
        mode=mode,
    )
    predicted = predictions(report)
    say("optimizing a copy to see which fixes apply")
    plan = build_variant(
        "plan", model, batch, optimizer=optimizer, gpu=gpu, spec=Spec(optimize_mode=mode)
    )
    applied = _applied_order(plan.optimize_report)
    applied += [t for t in disputed(plan.optimize_report, report) if t not in applied]
    planned = {t: applied_count(plan.optimize_report, t) for t in applied}
    left = left_out(plan.optimize_report, report, [*applied, *STEP_FIXES])
    runner = "compile" if mode == "compile" else "eager"
    specs = {GIVEN: Spec(runner=runner)}
    for i, tid in enumerate(applied):
        specs[f"+ {tid}"] = Spec(optimize_mode=mode, transforms=tuple(applied[: i + 1]),
                                 runner=runner, quiet_sites=True)  # fmt: skip
    last = specs[list(specs)[-1]]
    if "fused-optimizer" in predicted:
        last = specs["+ fused-optimizer"] = replace(last, fused_optimizer=True)
    if "cuda-graphs" in predicted:  # compiled: torch.compile's reduce-overhead mode
        runner = "graph" if mode == "eager" else "compile-graphs"
        specs["+ cuda-graphs"] = replace(last, runner=runner)
    del plan
    with room_to_compile(specs.values()):  # every stage compiles the same model's forward
        built, stages, failed = measure_variants(
            specs,
            model,
            batch,
            optimizer=optimizer,
            gpu=gpu,
            rounds=rounds,
            block=block,
            warmup=warmup,
            progress=say,
            settled=_stages_settled(list(specs)),
            max_rounds=max(3 * rounds, 9),
        )
    say("predicting each stage's step")
    expected = expected_steps(specs, built, report, predicted, gpu, mode)
    rows = _rows(stages, expected, predicted, places(planned, built))
    scale = host_scale(stages.get(GIVEN), report.step.host_s if report.step else None)
    if scale is not None:
        say(f"predicting each stage again on this host's rates (x {scale:.2f} the profile's)")
        here = scaled_target(gpu, scale)
        report_here = audit(model, inputs, here, dtype=model_dtype(model), train=True, mode=mode,
                            optimizer=make_optimizer(model, batch, optimizer))  # fmt: skip
        ahead = expected_steps(specs, built, report_here, predictions(report_here), here, mode)
        for row, before in zip(rows, stages, strict=False):
            if before in ahead and row.stage in ahead:
                row.predicted_here_wall_s = ahead[before][1] - ahead[row.stage][1]
    return LoopResult(
        model=name or type(model).__name__,
        mode=mode,
        stages=stages,
        rows=rows,
        predicted_step_s=report.step.wall_s if report.step else report.totals.roofline_time_s,
        audit=report,
        optimize_report=_last_report(built),
        failed=failed,
        host_scale=scale,
        left_out=left,
        expected=expected,
    )


def _last_report(built: dict[str, Variant]) -> Any:
    reports = [v.optimize_report for v in built.values() if v.optimize_report is not None]
    return reports[-1] if reports else None


def _rows(stages, expected, predicted, places) -> list[FixRow]:
    rows = []
    names = list(stages)
    for before, stage in itertools.pairwise(names):
        fix = stage.removeprefix("+ ")
        a, b = stages[before], stages[stage]
        busy = None
        if a.gpu_busy_s is not None and b.gpu_busy_s is not None:
            busy = a.gpu_busy_s - b.gpu_busy_s
        rows.append(
            FixRow(
                fix=fix,
                stage=stage,
                places=places.get(fix, 1),
                predicted_gpu_s=expected[before][0] - expected[stage][0],
                predicted_wall_s=expected[before][1] - expected[stage][1],
                measured_wall_s=a.median_s - b.median_s,
                measured_gpu_s=busy,
                findings=predicted.get(fix, (0.0, 0.0, []))[2],
                measured_rounds_s=_saved(a.step_times_s, b.step_times_s),
            )
        )
    return rows


def _saved(before, after) -> list[float]:
    return [x - y for x, y in zip(before, after, strict=False)]


SIGN_ALPHA = 0.05  # a sign test's one-sided level


def sign_settled(savings: list[float], alpha: float = SIGN_ALPHA) -> bool:
    """Whether round-by-round savings settle their sign: as many rounds saved (or lost) time
    as a fair coin would give with probability `alpha` or less (a sign test). Three rounds
    never settle it (all three agreeing happens 1 time in 8 by chance); five must agree;
    seven of eight suffice."""
    n = len(savings)
    k = max(sum(x > 0 for x in savings), sum(x < 0 for x in savings))
    tail = sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
    return n > 0 and tail <= alpha


def _stages_settled(names: list[str]) -> Any:
    """`time_blocks`' settled(): every fix's saving (a stage against the one before) is."""

    def settled(times: dict[str, list[float]]) -> bool:
        timed = [n for n in names if n in times]  # a stage that failed to build is not timed
        return all(sign_settled(_saved(times[a], times[b])) for a, b in itertools.pairwise(timed))

    return settled
