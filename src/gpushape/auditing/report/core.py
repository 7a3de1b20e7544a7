"""The audit report: per-layer costs, totals and findings, as a rich table or schema-1 JSON.

`Report.from_cost(cost_report, dtype=...)` groups a `CostReport`'s ops by (module, op, phase)
into `layers`; `findings` starts empty and the audit rules fill it. JSON (schema 1; see
docs/design.md):

    {"schema": 1, "model", "gpu", "dtype", "train",
     "totals": {"flops", "min_bytes", "roofline_time_s", "ops", + "gemm_flops", "kernel_time_s",
                "launch_s", "kernels"},
     "layers": [{"module", "op", "flops", "min_bytes", "intensity", "bound", "roofline_time_s",
                 "tensor_cores", + "module_type", "phase", "calls"}],
     "findings": [finding.to_dict(), ...],
     + "combined": {"saving_s", "step_s", "fixed_step_s", "fixes", "subsumed"},
     + "mode": "eager" | "compile" | "graph", + "bound": "host" | "GPU"}

Keys after "+" are additions to the schema's (consumers may ignore them). FLOPs count a
multiply-add as 2 (FLOPs = 2 x MACs); `gemm_flops` is the matmul/convolution/attention part.
Layers are sorted by predicted time, largest first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...tracing.cost import CostReport, CostTotals, OpCost

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Layer:
    """The ops of one (module, op, phase): summed over its calls."""

    module: str
    module_type: str
    op: str
    phase: str
    calls: int
    flops: int
    min_bytes: int
    roofline_time_s: float
    compute_bound_s: float  # the part of roofline_time_s spent in compute-bound calls
    tensor_cores: bool

    @property
    def intensity(self) -> float:
        return self.flops / self.min_bytes if self.min_bytes else 0.0

    @property
    def bound(self) -> str:
        return "compute" if self.compute_bound_s >= self.roofline_time_s / 2 else "memory"

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "op": self.op,
            "flops": self.flops,
            "min_bytes": self.min_bytes,
            "intensity": self.intensity,
            "bound": self.bound,
            "roofline_time_s": self.roofline_time_s,
            "tensor_cores": self.tensor_cores,
            "module_type": self.module_type,
            "phase": self.phase,
            "calls": self.calls,
        }


@dataclass(frozen=True, kw_only=True)
class Totals:
    flops: int
    min_bytes: int
    roofline_time_s: float
    ops: int  # ops that do work (views and allocations not counted)
    gemm_flops: int
    kernel_time_s: float
    launch_s: float
    kernels: int

    @classmethod
    def of(cls, totals: CostTotals) -> Totals:
        return cls(
            flops=totals.flops,
            min_bytes=totals.min_bytes,
            roofline_time_s=totals.roofline_time_s,
            ops=totals.ops,
            gemm_flops=totals.gemm_flops,
            kernel_time_s=totals.kernel_time_s,
            launch_s=totals.launch_s,
            kernels=totals.kernels,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "min_bytes": self.min_bytes,
            "roofline_time_s": self.roofline_time_s,
            "ops": self.ops,
            "gemm_flops": self.gemm_flops,
            "kernel_time_s": self.kernel_time_s,
            "launch_s": self.launch_s,
            "kernels": self.kernels,
        }


@dataclass(kw_only=True)
class Report:
    """What `gpushape audit` prints. `findings` hold objects with `to_dict()` (audit.Finding)."""

    model: str
    gpu: str  # catalog name, "h100-sxm"
    gpu_full_name: str
    dtype: str  # "bf16", "tf32"...
    train: bool
    totals: Totals
    layers: list[Layer]
    findings: list[Any] = field(default_factory=list)
    calibration: str | None = None  # where measured chip numbers came from; None: datasheet
    gpu_reason: str | None = None  # why this chip: "from --gpu", "the GPU present", ...
    inputs: str | None = None  # the example inputs in words: "batch 64, 3x224x224 images"
    with_loss: bool = False  # a library model traced with labels: its own loss in the step
    combined: Any = None  # what the non-overlapping fixes save together (auditing.combine)
    step: Any = None  # the step in the audited mode: GPU, launches, bound (auditing.modes)
    boundary_bytes: int = 0  # what reaches a compiled step's graphs from outside (Trace's)
    gpu_spec: Any = field(default=None, repr=False)  # the GPUSpec costed on (roofs of the plot)

    @classmethod
    def from_cost(cls, cost: CostReport, *, dtype: str) -> Report:
        return cls(
            model=cost.model,
            gpu=cost.gpu.name,
            gpu_full_name=cost.gpu.full_name,
            dtype=dtype,
            train=cost.train,
            totals=Totals.of(cost.totals),
            layers=group_layers(cost.ops),
            gpu_spec=cost.gpu,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "model": self.model,
            "gpu": self.gpu,
            "dtype": self.dtype,
            "train": self.train,
            "totals": self.totals.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
            "findings": [f if isinstance(f, dict) else f.to_dict() for f in self.findings],
            **({"combined": self.combined.to_dict()} if self.combined is not None else {}),
            **({"mode": self.step.mode, "bound": self.step.bound} if self.step else {}),
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def render(self, console: Any = None, *, top: int = 15, show_all: bool = False) -> None:
        """Print the findings (largest saving first; info findings only with `show_all`),
        what the fixes save together, then the per-module table (top modules by predicted
        time) and the totals."""
        from .render import render_findings
        from .table import _console, render_table

        console = console or _console()
        render_findings(self, console, show_all=show_all)
        render_table(self, console, top=top)

    def to_markdown(self, *, top: int = 20, show_all: bool = False) -> str:
        from .markdown import to_markdown

        return to_markdown(self, top=top, show_all=show_all)

    def to_html(self, path: Any = None, *, top: int = 40, show_all: bool = False) -> str:
        """One self-contained page (findings, layers, roofline plot); written to `path` if
        given. Returns the HTML."""
        from .html import to_html

        return to_html(self, path, top=top, show_all=show_all)


def group_layers(ops: Iterable[OpCost]) -> list[Layer]:
    """Sum op costs per (module, op, phase); ops that do no work are left out."""
    groups: dict[tuple[str, str, str], list[OpCost]] = {}
    for op in ops:
        if op.bound != "none":
            groups.setdefault((op.module, op.op, op.phase), []).append(op)
    layers = [
        Layer(
            module=module,
            module_type=members[0].module_type,
            op=op,
            phase=phase,
            calls=len(members),
            flops=sum(o.flops for o in members),
            min_bytes=sum(o.min_bytes for o in members),
            roofline_time_s=sum(o.roofline_time_s for o in members),
            compute_bound_s=sum(o.roofline_time_s for o in members if o.bound == "compute"),
            tensor_cores=any(o.tensor_cores for o in members),
        )
        for (module, op, phase), members in groups.items()
    ]
    return sorted(layers, key=lambda layer: layer.roofline_time_s, reverse=True)
