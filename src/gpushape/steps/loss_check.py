"""Does a faster variant still train? `gpushape bench --loss-steps N`.

Each variant is built afresh from the model's own weights and trains N steps on the bench's
fixed synthetic batch; with labels fixed, the model learns that batch by heart and its loss
falls. A variant that computes what the baseline computes (its rewrites checked numerically,
its kernels exact to rounding) falls along the same curve; one that broke the gradient, the
optimizer or the data falls slower, stalls, or diverges. Two gaps, each over how far the
baseline fell (its first loss less its last):

    mean gap  = mean over the steps both ran of |variant's loss - baseline's loss| / fall
    final gap = |variant's last - baseline's last| / fall

"last" the mean of the final TAIL steps, so one noisy step does not decide it. A model that
learns a small batch by heart reaches near zero whatever it lost on the way, so the end alone
would pass a variant that trains slower; the mean gap does not. The curves are aligned step
for step: a whole-step CUDA graph takes real steps while it warms up before the capture
(`LossCurve.start`), and its first recorded loss is the baseline's step `start`. bf16
rounding and dropout masks drawn in another order make curves differ by a little; both gaps
at most TRACKS (10% of the fall) is "tracks the baseline".
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError
from .batch import Batch

TAIL = 3  # the last losses averaged as a curve's end
TRACKS = 0.10  # both gaps up to this share of the baseline's fall: the variant tracks it
FLAT = 0.05  # a baseline falling by less than this share of its first loss has not trained
MIN_STEPS = 2 * TAIL  # fewer steps cannot tell a start from an end


@dataclass(frozen=True)
class LossCurve:
    variant: str
    losses: tuple[float, ...]
    start: int = 0
    """Real steps the variant took before its first recorded loss (a CUDA graph's warm-up)."""

    def at(self, step: int) -> float | None:
        """The loss after `step` steps from the common initial weights (None: not recorded)."""
        i = step - self.start
        return self.losses[i] if 0 <= i < len(self.losses) else None

    def end(self) -> float:
        tail = self.losses[-TAIL:]
        return sum(tail) / len(tail)


@dataclass(frozen=True)
class LossVerdict:
    variant: str
    first: float
    last: float
    final_gap: float | None
    """|last - the baseline's last| over the baseline's fall (None for the baseline itself)."""
    mean_gap: float | None
    """The mean gap over the steps both curves recorded, over the baseline's fall."""
    verdict: str
    """baseline, tracks, differs, diverged (a loss not finite), or flat (the baseline did not
    fall: nothing to compare)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        head = f"{self.variant}: {self.first:.4g} -> {self.last:.4g}"
        if self.verdict in ("baseline", "flat", "diverged") or self.final_gap is None:
            say = {
                "baseline": "the baseline",
                "flat": "the baseline's loss did not fall: raise --loss-steps",
                "diverged": "diverged (a loss that is not finite)",
            }
            return f"{head}, {say.get(self.verdict, self.verdict)}"
        return (
            f"{head}, {self.verdict} (apart by {self.mean_gap:.1%} of the baseline's fall on "
            f"average, {self.final_gap:.1%} at the end)"
        )


def compare(curves: Mapping[str, LossCurve], baseline: str) -> dict[str, LossVerdict]:
    """Each curve's verdict against `baseline`'s (which must be in `curves` and start at 0),
    the two compared over the steps both recorded: where the variant's curve ends."""
    base = curves[baseline]
    b_first = base.losses[0]
    flat = not all(map(math.isfinite, base.losses)) or b_first - base.end() < FLAT * abs(b_first)
    out = {}
    for name, curve in curves.items():
        first, last = curve.losses[0], curve.end()
        if not all(map(math.isfinite, curve.losses)):
            out[name] = LossVerdict(name, first, last, None, None, "diverged")
            continue
        if name == baseline or flat:
            verdict = "baseline" if name == baseline else "flat"
            out[name] = LossVerdict(name, first, last, None, None, verdict)
            continue
        steps = range(curve.start, curve.start + len(curve.losses))
        both = [s for s in steps if base.at(s) is not None]
        tail = both[-TAIL:]
        if not tail:
            out[name] = LossVerdict(name, first, last, None, None, "flat")
            continue
        b_last = sum(base.at(s) for s in tail) / len(tail)  # type: ignore[misc]
        v_last = sum(curve.at(s) for s in tail) / len(tail)  # type: ignore[misc]
        fall = b_first - b_last
        if fall < FLAT * abs(b_first):
            out[name] = LossVerdict(name, first, last, None, None, "flat")
            continue
        final_gap = abs(v_last - b_last) / fall
        gaps = [abs(curve.at(s) - base.at(s)) for s in both]  # type: ignore[operator]
        mean_gap = sum(gaps) / len(gaps) / fall
        verdict = "tracks" if max(final_gap, mean_gap) <= TRACKS else "differs"
        out[name] = LossVerdict(name, first, last, final_gap, mean_gap, verdict)
    return out


def record_curve(run: Callable[[], Any], steps: int, variant: str, start: int = 0) -> LossCurve:
    """`steps` calls of `run` (one training step each, returning the loss), their losses."""
    losses = []
    for _ in range(steps):
        loss = run()
        losses.append(float(loss.detach().float()))  # a host sync per step: fine here
    return LossCurve(variant, tuple(losses), start)


def loss_curves(
    specs: Mapping[str, Any],
    model: nn.Module,
    batch: Batch,
    *,
    steps: int,
    optimizer: str,
    gpu: Any,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[dict[str, LossCurve], dict[str, str]]:
    """Each variant of `specs` (name -> variants.Spec; the first is the baseline) built from
    `model`'s weights and trained `steps` steps on `batch`, one at a time (each freed before
    the next is built): (the curves, why the others failed). The baseline's curve runs as many
    steps further as the longest warm-up, so every curve has a baseline to meet."""
    from .variants import build_variant

    if steps < MIN_STEPS:
        raise GpushapeError(f"--loss-steps must be at least {MIN_STEPS}, got {steps}")
    curves: dict[str, LossCurve] = {}
    failed: dict[str, str] = {}
    names = list(specs)
    order = names[1:] + names[:1]  # the baseline last: it knows how far the others started
    for name in order:
        progress(f"training {name} for {steps} steps from the model's weights")
        torch.manual_seed(seed)  # the same dropout masks where the kernels draw them alike
        try:
            variant = build_variant(name, model, batch, optimizer=optimizer, gpu=gpu,
                                    spec=specs[name])  # fmt: skip
            extra = max((c.start for c in curves.values()), default=0) if name == names[0] else 0
            curves[name] = record_curve(variant.run, steps + extra, name, variant.steps_run)
        except Exception as exc:
            if name == names[0]:
                if isinstance(exc, GpushapeError):
                    raise
                raise GpushapeError(
                    f"the baseline {name!r} failed to train: {type(exc).__name__}: {exc}"
                ) from exc
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        finally:
            variant = None  # free its model, optimizer state and graphs before the next
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return {n: curves[n] for n in names if n in curves}, failed
