"""What a rule receives: the trace, its cost on the target chip, the chip, and the extras.

Rules read everything through `AuditContext`; none of them holds a hardware number of its own
(alignment, SM count, launch overheads, peaks and bandwidth all come from `ctx.gpu`, which is
the datasheet or, when a profile was applied, the chip calibrated by measurement).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from ..hardware import GPUSpec
from ..tracing.cost import CostReport, OpCost, op_cost
from ..tracing.flops.registry import op_work
from ..tracing.records import OpRecord, Trace
from .finding import (
    MEMORY_SHARE_THRESHOLDS,
    TIME_SHARE_THRESHOLDS,
    Finding,
    Severity,
    severity_for_share,
)
from .fixes import FIXES
from .observe import Observations


@dataclass(frozen=True, kw_only=True)
class BackendFlags:
    """The math settings a step runs under (torch.backends and autocast)."""

    matmul_tf32: bool = False  # torch.backends.cuda.matmul.allow_tf32 (PyTorch default False)
    cudnn_tf32: bool = True  # torch.backends.cudnn.allow_tf32 (PyTorch default True)
    autocast: str | None = None  # "bf16" / "fp16" when the step runs under autocast

    @classmethod
    def current(cls, autocast: str | None = None) -> BackendFlags:
        """The settings of this process (the float32 matmul precision counts as TF32 when it
        is not "highest")."""
        import torch

        matmul = bool(
            torch.backends.cuda.matmul.allow_tf32
            or torch.get_float32_matmul_precision() != "highest"
        )
        return cls(
            matmul_tf32=matmul, cudnn_tf32=bool(torch.backends.cudnn.allow_tf32), autocast=autocast
        )

    def math_mode(self) -> str | None:
        """The cost model's math mode for these flags (see trace/cost.py)."""
        if self.autocast:
            return self.autocast
        if self.matmul_tf32:
            return "tf32"  # a TF32 matmul with TF32 convolutions off is too rare to model apart
        return None if self.cudnn_tf32 else "fp32"

    def to_dict(self) -> dict[str, Any]:
        return {
            "matmul_tf32": self.matmul_tf32,
            "cudnn_tf32": self.cudnn_tf32,
            "autocast": self.autocast,
        }


@dataclass(kw_only=True)
class AuditContext:
    trace: Trace
    cost: CostReport
    gpu: GPUSpec
    model: Any = None  # the nn.Module traced (its module tree), when there is one
    observed: Observations = field(default_factory=Observations)
    optimizer: Any = None
    dataloader: Any = None
    flags: BackendFlags = field(default_factory=BackendFlags)
    profile: str | None = None  # where calibrated numbers came from; None: the datasheet
    measured: Mapping[str, Any] = field(default_factory=dict)  # the probe's profile, raw

    # ---- the step ----------------------------------------------------------------------------
    @property
    def train(self) -> bool:
        return self.trace.train

    @cached_property
    def step_time_s(self) -> float:
        """The traced step's time (forward and backward, no optimizer): what time savings are a
        share of. Its eager wall clock where the profile measured the GPU's idle time between
        kernels, else the cost model's kernels and launches in series (`modes.traced_step_s`)."""
        from .modes import traced_step_s

        return traced_step_s(self)

    @cached_property
    def optimizer_step(self) -> Any:
        """The optimizer's step as tracing/optimizer_step.py counts it (a StepCost), or None:
        no optimizer, or one whose step cannot run on meta stand-ins."""
        from ..tracing.optimizer_step import current_step

        if not isinstance(self.optimizer, torch.optim.Optimizer):
            return None
        try:
            return current_step(self.optimizer)
        except Exception as e:  # an optimizer that needs real values: no estimate, said
            warnings.warn(
                f"gpushape: {type(self.optimizer).__name__}'s step could not be priced on meta "
                f"tensors ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "the audited step counts no optimizer step",
                stacklevel=2,
            )
            return None

    @cached_property
    def optimizer_gpu_s(self) -> float:
        """The GPU's work of the optimizer's step (`tracing.optimizer_step.step_gpu_s`; 0.0
        without a priced step). The timed step runs it after the backward, on the GPU's queue:
        a LLaMA-style decoder's foreach AdamW on the H200 ran 2.04 ms of `multi_tensor_apply`
        kernels a step, EfficientNet-B0's foreach SGD 0.12 ms for 0.02 ms of bytes."""
        from ..tracing.optimizer_step import step_gpu_s

        step = self.optimizer_step
        return step_gpu_s(step, self.optimizer, self.gpu) if step is not None else 0.0

    @cached_property
    def forward_time_s(self) -> float:
        return self.cost.forward.roofline_time_s

    @cached_property
    def _backward_index(self) -> dict[int, list[int]]:
        index: dict[int, list[int]] = {}
        for rec in self.trace.ops:
            if rec.fwd_index is not None:
                index.setdefault(rec.fwd_index, []).append(rec.index)
        return index

    def op_cost(self, rec: OpRecord | int) -> OpCost:
        return self.cost.ops[rec if isinstance(rec, int) else rec.index]

    def backward_of(self, rec: OpRecord) -> list[OpRecord]:
        """The backward ops autograd ran for forward op `rec`."""
        return [self.trace.ops[i] for i in self._backward_index.get(rec.index, ())]

    def with_backward(self, rec: OpRecord) -> list[OpRecord]:
        return [rec, *self.backward_of(rec)]

    @cached_property
    def launch_bound(self) -> bool:
        """Whether the CPU's eager launches take longer than the GPU's kernels (the CPU sets
        the pace). Savings count launch overheads only then: otherwise the GPU's queue of
        launched work hides them."""
        totals = self.cost.totals
        return totals.launch_s > totals.kernel_time_s

    def op_time_s(self, cost: OpCost) -> float:
        """An op's time as savings count it (see `launch_bound`)."""
        return cost.roofline_time_s if self.launch_bound else cost.kernel_time_s

    def time_s(self, recs: Iterable[OpRecord]) -> float:
        """Traced ops' time, as savings count it."""
        return sum(self.op_time_s(self.op_cost(r)) for r in recs)

    def price(self, recs: Iterable[OpRecord], math: str | None = "trace") -> float:
        """Records that were not traced (a fix's ops), costed like the trace (same math mode
        unless `math` is given), as savings count time."""
        mode = self.cost.math if math == "trace" else math
        return sum(self.op_time_s(op_cost(r, self.gpu, mode)) for r in recs)

    def forward_compute(self) -> list[OpRecord]:
        return [r for r in self.trace.ops if r.phase == "forward" and r.kind == "compute"]

    # ---- where numbers came from -------------------------------------------------------------
    @property
    def numbers(self) -> str:
        """Said in every finding's evidence: datasheet or calibrated."""
        if self.profile:
            return f"calibrated by measurement: {self.profile}"
        return "datasheet (achievable fractions assumed)"

    def bandwidth_bytes_per_s(self) -> float:
        return self.gpu.attainable_bandwidth_bytes_per_s()

    def bytes_time_s(self, nbytes: float) -> float:
        """Time to move `nbytes` at the chip's attainable bandwidth."""
        return nbytes / self.bandwidth_bytes_per_s()

    def fusion_saving_s(
        self, recs: Iterable[OpRecord], removed_bytes: float, fused_family: str | None = None
    ) -> float:
        """What fusing forward ops `recs` (with their backward ops) into one memory-bound kernel
        a direction saves in GPU time: their kernel time as the cost model prices it (each
        op's bytes at its family's measured efficiency: eager kernels) less the fused kernels',
        which move the same bytes but `removed_bytes` at the copy rate times the efficiency
        measured for gpushape's kernel of that fix (`fused_family`; 1 when unmeasured). The
        bytes kept include the second passes of two-pass ops (BatchNorm in training), which a
        fused kernel makes too. Never less than the time of the removed bytes alone. Launches
        saved are the launch-bound rule's to count."""
        recs = [o for r in recs for o in self.with_backward(r)]
        ops = [self.op_cost(o) for o in recs]
        moved = sum(c.min_bytes + op_work(o).reread_bytes for c, o in zip(ops, recs))
        kept = max(moved - removed_bytes, 0.0)
        unfused = sum(c.kernel_time_s for c in ops)
        fused = self.bytes_time_s(kept) / self.gpu.achievable.memory(fused_family)
        return max(unfused - fused, self.bytes_time_s(removed_bytes))

    # ---- making findings ---------------------------------------------------------------------
    def finding(
        self,
        rule: str,
        module: str,
        message: str,
        evidence: Mapping[str, Any],
        *,
        saving_s: float | None,
        fix: str | None,
        severity: Severity | None = None,
        basis_s: float | None = None,
        replaces: Iterable[OpRecord] | None = None,
    ) -> Finding:
        """A finding whose severity follows `saving_s` as a share of the step (or of
        `basis_s`); pass `severity` to state it outright (rules with no time estimate).
        `replaces`: the traced ops the fix rewrites (their backward ops count too), so that
        overlapping fixes are not added up (`combine.py`)."""
        if fix is not None and fix not in FIXES:
            raise ValueError(f"rule {rule}: unknown fix {fix!r}; add it to audit/fixes.py")
        basis = self.step_time_s if basis_s is None else basis_s
        share = None
        if saving_s is not None and basis > 0:
            share = saving_s / basis
        if severity is None:
            severity = severity_for_share(share, TIME_SHARE_THRESHOLDS)
        evidence = {**evidence, "numbers": self.numbers}
        if share is not None:
            evidence.setdefault("share_of_step", round(share, 5))
        return Finding(
            rule=rule,
            severity=severity,
            module=module,
            message=message,
            evidence=evidence,
            est_saving_s=saving_s,
            fix=fix,
            replaces=None if replaces is None else self.footprint(replaces),
        )

    def footprint(self, recs: Iterable[OpRecord]) -> frozenset[int]:
        """Trace positions of `recs` and of the backward ops autograd ran for them."""
        return frozenset(o.index for r in recs for o in self.with_backward(r))

    def records_of(self, modules: Iterable[str]) -> list[OpRecord]:
        """The forward ops that `modules` ran themselves (not their children's)."""
        wanted = set(modules)
        return [r for r in self.forward_compute() if r.module in wanted]

    def memory_finding(
        self,
        rule: str,
        module: str,
        message: str,
        evidence: Mapping[str, Any],
        *,
        share: float,
        fix: str | None,
        cap: Severity = Severity.HIGH,
    ) -> Finding:
        """A finding about memory: severity from the share of activation memory it frees,
        capped at `cap`."""
        severity = min(severity_for_share(share, MEMORY_SHARE_THRESHOLDS), cap)
        return Finding(
            rule=rule,
            severity=severity,
            module=module,
            message=message,
            evidence={**evidence, "share_of_activations": round(share, 5), "numbers": self.numbers},
            est_saving_s=None,
            fix=fix,
        )
