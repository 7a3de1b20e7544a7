"""`gpushape.optimize(model, example_inputs, ...) -> (model, OptimizeReport)`.

Audit the model for the target chip, pick the transforms its findings name (or the ones asked
for), apply each, check that the model still computes the same function (`_verify.py`: outputs
and every original parameter's gradient, within the kernels' numeric gate), roll back any
transform that fails, and audit the result. The model is rewritten in place, as torchao's
`quantize_` does, and returned (a new object only where a transform had to replace the root);
`gpushape.transforms.revert(model)` undoes everything. In compile mode only transforms that
still pay under torch.compile are picked. A model on the meta device is rewritten and audited
but cannot be checked numerically: the report says so.

One transform is a correctness guard rather than a fix: where PyTorch's channels_last
avg_pool2d backward is wrong on the model's device (pytorch#188344, measured there) and the
model holds a padded `nn.AvgPool2d`, `safe-avg-pool` is applied first, asked for or not, and
never rolled back for speed (`safe_avg_pool.needed`); the report lists its changes.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError
from ._core import (
    Change,
    FilterFn,
    Refusal,
    TransformContext,
    forget,
    get_transform,
    remember,
    undo,
)
from ._picking import held_back, now_worth, pick, without
from ._picking import quiet_sites as quiet_fix_sites
from ._verify import Verification, compute_dtype, lower_reference, reference, verify
from .autocast import audit_flags
from .safe_avg_pool import ID as SAFE_AVG_POOL
from .safe_avg_pool import needed as avg_pool_guard_needed

MODES = ("eager", "compile", "graph")
CHECKPOINT = "activation-checkpoint"  # last: it plans on the model the others left
# after all of them, in eager mode on a GPU, and only where a timed step says it pays: the
# model's layers replayed from CUDA graphs, which removes the host's dispatch from their time
GRAPH_LAYERS = "graph-layers"
# kept whatever the audit predicts: one trades time for memory on purpose, the other is a
# correctness guard (its swap is invisible to the audit's meta trace anyway)
NOT_TIMED = (CHECKPOINT, SAFE_AVG_POOL)


@dataclass(kw_only=True)
class OptimizeReport:
    """What `optimize` did: each change with its place, what it refused and rolled back."""

    model: str
    gpu: str
    mode: str
    applied: list[Change] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    rolled_back: list[Refusal] = field(default_factory=list)
    skipped: list[Refusal] = field(default_factory=list)
    """Fixes the findings name that no transform applies here (none exists yet, or it does not
    pay in this mode)."""
    verified: dict[str, Verification] = field(default_factory=dict)
    predicted_saving_s: dict[str, float] = field(default_factory=dict)
    """Per transform: what the audit's findings for its fix predicted, each fix priced alone
    (`before.combined` has what the fixes save together)."""
    measured: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per transform kept on a timing (graph-layers): (seconds without, seconds with) of what
    it changes (the layers' forward and backward), timed on the model's GPU."""
    before: Any = None
    """The audit of the model as given (`gpushape.auditing.report.Report`)."""
    after: Any = None
    """The audit of the optimized model."""

    @property
    def step_before_s(self) -> float:
        """The audit's predicted step (as its header shows it) before the rewrites."""
        from ..auditing.modes import predicted_step_s

        return predicted_step_s(self.before) if self.before else float("nan")

    @property
    def step_after_s(self) -> float:
        """The audit's predicted step after the rewrites; compiled, the host as given less the
        kernels they removed, each at the step's host cost per kernel
        (`auditing.modes.compiled_stage`)."""
        from ..auditing.modes import compiled_stage, predicted_step_s

        if self.after is None:
            return float("nan")
        given, stage = getattr(self.before, "step", None), getattr(self.after, "step", None)
        if self.mode == "compile" and given is not None and stage is not None:
            return compiled_stage(given, stage).wall_s
        return predicted_step_s(self.after)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "mode": self.mode,
            "predicted_step_before_s": self.step_before_s,
            "predicted_step_after_s": self.step_after_s,
            "applied": [
                {"transform": c.transform, "module": c.module, "detail": c.detail}
                for c in self.applied
            ],
            "refused": [r.__dict__ for r in self.refused],
            "rolled_back": [r.__dict__ for r in self.rolled_back],
            "skipped": [r.__dict__ for r in self.skipped],
            "verified": {
                k: {"passed": v.passed, "checked": v.checked, "worst": v.worst}
                for k, v in self.verified.items()
            },
            "predicted_saving_s": self.predicted_saving_s,
            "measured_s": {k: list(v) for k, v in self.measured.items()},
        }


def _real_inputs(inputs: tuple) -> bool:
    leaves = [t for t in torch.utils._pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    return bool(leaves) and all(t.device.type != "meta" for t in leaves)


def optimize(
    model: nn.Module,
    example_inputs: Any,
    gpu: Any = None,
    train: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    mode: str = "eager",
    memory_budget: int | None = None,
    transforms: list[str] | None = None,
    filter_fn: FilterFn | None = None,
    verify_inputs: Any = None,
    quiet_sites: bool | None = None,
) -> tuple[nn.Module, OptimizeReport]:
    """Apply the audit's fixes to `model` (in place); see the module docstring.

    `verify_inputs`: smaller inputs for the numeric check (it runs the model in float64);
    default the example inputs, which the audits and the transforms see. `quiet_sites`: leave
    alone the sites whose finding saves nothing in `mode` where another finding of the same fix
    pays (default: when the fixes come from the findings, not from `transforms`; the
    fix-by-fix loop also sets it for its stages, which name the fixes the plan applied)."""
    from ..auditing.api import audit

    if mode not in MODES:
        raise GpushapeError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if memory_budget is not None and (not train or memory_budget < 0):
        raise GpushapeError(
            "memory_budget bounds the activations kept for a training step's backward: "
            "pass train=True and a budget of zero bytes or more"
        )
    if not isinstance(model, nn.Module):
        raise GpushapeError(f"optimize() needs an nn.Module, got {type(model).__name__}")
    inputs = _as_tuple(example_inputs)
    flags = audit_flags(model)
    before = audit(model, inputs, gpu, dtype=dtype, train=train, mode=mode, flags=flags)
    out = OptimizeReport(model=before.model, gpu=before.gpu, mode=mode, before=before)
    ctx = TransformContext(
        example_inputs=inputs,
        train=train,
        mode=mode,
        gpu=before.gpu_spec,
        filter_fn=filter_fn,
        memory_budget=memory_budget,
    )
    check_inputs = inputs if verify_inputs is None else _as_tuple(verify_inputs)
    checked = _real_inputs(check_inputs) and not any(p.is_meta for p in model.parameters())
    ref = _Reference(model, check_inputs) if checked else None
    graphable = transforms is None and mode == "eager" and train and checked and _on_cuda(model)
    guard = _Guard(before, inputs, gpu, dtype, train, mode, graphable=graphable, model=model)
    picked = pick(before, transforms, mode, out)
    if SAFE_AVG_POOL not in picked and avg_pool_guard_needed(model, inputs):
        picked.insert(0, SAFE_AVG_POOL)  # pytorch#188344 on this device: guarded, unasked, first
    if memory_budget is not None and CHECKPOINT not in picked:
        picked.append(CHECKPOINT)  # a budget asks for it, with or without a finding
    if quiet_sites is None:
        quiet_sites = transforms is None
    quiet = quiet_fix_sites(before, mode, out) if quiet_sites else {}
    for tid in picked:
        site_ctx = without(ctx, quiet[tid]) if tid in quiet else ctx
        model = _apply_one(model, tid, site_ctx, ref, out, guard if transforms is None else None)
    again = held_back(before, picked) if transforms is None and out.applied else []
    if again:  # a fix the ops the others replaced held back (channels-last after GroupNormAct)
        now = audit(model, inputs, gpu, dtype=dtype, train=train, mode=mode,
                    flags=audit_flags(model))  # fmt: skip
        for tid, saving in now_worth(now, again).items():
            out.predicted_saving_s[tid] = saving
            model = _apply_one(model, tid, ctx, ref, out, guard)
    if graphable:
        model = _measured(model, GRAPH_LAYERS, ctx, out)
    _nothing_found(transforms or (), out)
    flags = audit_flags(model)
    out.after = audit(model, inputs, gpu, dtype=dtype, train=train, mode=mode, flags=flags)
    return model, out


def _nothing_found(asked: Any, out) -> None:
    """A transform asked for by name that found no place to rewrite says so (else the report
    would not mention it): `gpushape optimize hf:gpt2 --transforms s2d-stem` printed an empty
    table."""
    said = {r.transform for r in (*out.applied, *out.refused, *out.rolled_back, *out.skipped)}
    for tid in asked:
        if tid not in said:
            reason = "found nothing in this model that it rewrites"
            out.skipped.append(Refusal(transform=tid, module="", reason=reason))


def _measured(model: nn.Module, tid: str, ctx: TransformContext, out) -> nn.Module:
    """Apply `tid` where a measurement on the model's GPU says it pays: graph-layers captures
    a stack of repeated layers, kept only if the layers' forward and backward, timed eager and
    replayed, is faster replayed by graph_layers.FASTER (the host model cannot yet tell host-
    from GPU-bound steps well enough to decide this)."""
    from . import graph_layers

    outcome = get_transform(tid).apply(model, dataclasses.replace(ctx, measure=True))
    out.refused += outcome.refusals
    if not outcome.changes:
        return model
    eager_s, graphed_s = outcome.measured
    if graphed_s > eager_s * graph_layers.FASTER:
        undo(outcome.changes)
        timed = f"{eager_s * 1e3:,.2f} -> {graphed_s * 1e3:,.2f} ms"
        reason = f"the layers' forward + backward timed {timed}: not 3% faster"
        out.rolled_back.append(Refusal(transform=tid, module="", reason=reason))
        return model
    out.measured[tid] = outcome.measured
    remember(model, outcome.changes)
    out.applied += outcome.changes
    return model


def _on_cuda(model: nn.Module) -> bool:
    """graph-layers is tried only on a GPU (elsewhere it is not even reported)."""
    params = list(model.parameters())
    return bool(params) and all(p.is_cuda for p in params)


def _as_tuple(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


class _Guard:
    """Rolls back a transform the audit of the rewritten model predicts to be slower on the
    chip in the mode: a longer wall clock (in eager mode a host-bound step's wall clock grows
    with the host's dispatch, and gpushape's own fused ops cost the host more than PyTorch's:
    measured on the H200, EfficientNet-B0's step went 31.4 -> 41.0 ms when its BatchNorm+SiLU
    pairs became fused kernels while its GPU time fell), or a longer GPU time at the same wall
    clock. A finding prices its own ops, the audit of the whole rewritten step also prices what
    the rewrite adds around them (copies, slices' gradients, the host's dispatch). Only for
    transforms picked from the findings; ones asked for by name are kept
    (the report still shows the predicted step before and after), and activation-checkpoint,
    which trades time for memory on purpose, is exempt.

    Where optimize will then try graph-layers (`graphable`: eager training on a GPU), a fix
    predicted slower only because the eager step is host-bound is kept if the audit's graph
    mode (the layers' dispatch replayed) predicts it faster: graph-layers, kept where replaying
    the layers pays, takes the host's dispatch out of their time, and where it does not pay the
    layers were not host-bound, so the GPU time the fix saves reaches the step either way.
    (MobileNetV3 on the H200: channels_last was rolled back as "host-bound after the fused
    BatchNorms", while the step, timed, was GPU-bound at 15.2 ms of GPU work in 15.7.)"""

    def __init__(
        self, before: Any, inputs: tuple, gpu: Any, dtype, train: bool, mode: str, *,
        graphable: bool = False, model: nn.Module | None = None,
    ):  # fmt: skip
        self.inputs, self.gpu, self.dtype, self.train, self.mode = inputs, gpu, dtype, train, mode
        self.step = _predicted(before)
        self.graphable = graphable
        self.graph_step = self._graph(model) if graphable else None

    def _audit(self, model: nn.Module, mode: str) -> Any:
        from ..auditing.api import audit

        return audit(model, self.inputs, self.gpu, dtype=self.dtype, train=self.train,
                     mode=mode, flags=audit_flags(model))  # fmt: skip

    def _graph(self, model: nn.Module | None) -> tuple[float, float] | None:
        return None if model is None else _predicted(self._audit(model, "graph"))

    def slower(self, model: nn.Module) -> str | None:
        """Why the rewritten model is predicted slower, or None (and it becomes the baseline)."""
        (gpu0, wall0), (gpu1, wall1) = self.step, _predicted(self._audit(model, self.mode))
        graph = self._graph(model) if self.graphable else None
        if _worse((gpu0, wall0), (gpu1, wall1)) and not (
            graph is not None and self.graph_step is not None
            and gpu1 <= gpu0 * (1 + SLOWER) and not _worse(self.graph_step, graph)
        ):  # fmt: skip
            return (
                f"predicted slower on this chip: step {wall0 * 1e3:,.3f} -> {wall1 * 1e3:,.3f} ms "
                f"(GPU {gpu0 * 1e3:,.3f} -> {gpu1 * 1e3:,.3f} ms)"
            )
        self.step, self.graph_step = (gpu1, wall1), graph
        return None


def _worse(before: tuple[float, float], after: tuple[float, float]) -> bool:
    """A longer wall clock, or a longer GPU time at the same wall clock (each (GPU, wall))."""
    (gpu0, wall0), (gpu1, wall1) = before, after
    return wall1 > wall0 * (1 + SLOWER) or (gpu1 > gpu0 * (1 + SLOWER) and wall1 >= wall0)


SLOWER = 1e-3  # a relative change below this is no change


def _predicted(report: Any) -> tuple[float, float]:
    step = report.step
    if step is None:
        return (report.totals.kernel_time_s, report.totals.roofline_time_s)
    return (step.gpu_s, step.wall_s)


class _Reference:
    """The original model's results, computed before the first change and only if one comes;
    its run in a lower dtype when a rewrite computes in one (autocast), so its copy is kept
    until optimize returns (the first check, with its float64 run, is the peak either way)."""

    def __init__(self, model: nn.Module, inputs: tuple):
        self.model, self.inputs, self.value = copy.deepcopy(model), inputs, None
        self.lower: dict[torch.dtype, dict | None] = {}

    def results(self):
        if self.value is None:
            self.value = reference(self.model, self.inputs)
        return self.value

    def at(self, dtype: torch.dtype | None) -> dict | None:
        if dtype is not None and dtype not in self.lower:
            self.lower[dtype] = lower_reference(self.model, self.inputs, dtype)
        return self.lower.get(dtype)


def _check(model: nn.Module, inputs: tuple, ref: _Reference) -> Verification:
    """The gate; a rewritten model that no longer runs fails it, with the error as the reason."""
    results = ref.results()
    try:
        return verify(model, inputs, results, ref.at(compute_dtype(model)), ref.at)
    except Exception as exc:  # a broken rewrite is rolled back and reported, never raised
        reason = f"the rewritten model failed to run: {type(exc).__name__}: {exc}"
        return Verification(passed=False, checked=0, worst=reason.splitlines()[0][:300])


def _apply_one(
    model: nn.Module, tid: str, ctx: TransformContext, ref, out, guard: _Guard | None
) -> nn.Module:
    outcome = get_transform(tid).apply(model, ctx)
    out.refused += outcome.refusals
    if not outcome.changes:
        return model
    new_root = outcome.root or model
    if ref is not None:
        check = _check(new_root, ref.inputs, ref)
        out.verified[tid] = check
        if not check.passed:
            restored = undo(outcome.changes) or model
            out.rolled_back.append(Refusal(transform=tid, module="", reason=check.worst))
            return restored
    slower = guard.slower(new_root) if guard is not None and tid not in NOT_TIMED else None
    if slower is not None:
        restored = undo(outcome.changes) or model
        out.rolled_back.append(Refusal(transform=tid, module="", reason=slower))
        return restored
    forget(new_root, model)
    remember(new_root, outcome.changes)
    out.applied += outcome.changes
    return new_root
