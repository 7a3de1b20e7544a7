"""torch.compile by preset, with what stands in its way: graph breaks and recompiles.

torch.compile pays in proportion to how much of the step it sees at once. A graph break (a
`.item()`, a print, a call dynamo cannot trace) splits the model into graphs with eager Python
between them: fusions stop at the break, and under "reduce-overhead" each graph is its own CUDA
graph. A recompile (a new shape, dtype or Python value its guards did not expect) costs the
compilation again, and past torch's recompile limit the function runs eagerly. So
`compile_model` first runs `torch._dynamo.explain` on the example inputs (graphs, breaks with
their reason and place, ops per graph), then compiles; `CompileReport.count_recompiles()`
counts the model's recompiles so far, from dynamo's cache of compiled variants of its forward.

Explaining runs the model's forward once (buffers such as BatchNorm's running statistics and
the random generators are restored afterwards) and resets dynamo's caches: other compiled
functions in the process compile again on their next call. `explain=False` skips it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

import torch
from torch import nn

from ._core import TransformError, state_restored

PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"mode": "reduce-overhead"},
    "max-autotune": {"mode": "max-autotune"},
    "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs"},
}
SHOWN = 3  # graph breaks listed by CompileReport.lines()


def _cache_entries(code: CodeType | None) -> int:
    if code is None:
        return 0
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:  # pragma: no cover - a torch without it
        return 0
    return len(_debug_get_cache_entry_list(code))


def _recompile_limit() -> int | None:
    config = torch._dynamo.config
    return getattr(config, "recompile_limit", getattr(config, "cache_size_limit", None))


@dataclass(kw_only=True)
class CompileReport:
    """What `compile_model` found and did."""

    preset: str
    options: dict[str, Any]
    """What was passed to torch.compile."""
    graphs: int | None = None
    """Graphs dynamo made of the forward on the example inputs (None: not explained)."""
    graph_breaks: list[tuple[str, str]] = field(default_factory=list)
    """(reason, where) per break: the reason's first line and file:line in function."""
    ops_per_graph: list[int] = field(default_factory=list)
    forward: CodeType | None = field(default=None, repr=False)
    """The code object dynamo caches the model's compiled variants on."""
    entries_before: int = field(default=0, repr=False)

    def count_recompiles(self) -> int:
        """Compilations of the model's forward after its first, so far (0 before the compiled
        model has run). Instances of the same class share the count: dynamo caches per code."""
        return max(0, _cache_entries(self.forward) - self.entries_before - 1)

    def lines(self) -> list[str]:
        """The report in a few lines."""
        out = [f"torch.compile preset {self.preset!r} ({self.options or 'defaults'})"]
        if self.graphs is not None:
            ops = ", ".join(str(n) for n in self.ops_per_graph)
            out.append(
                f"{self.graphs} graphs ({len(self.graph_breaks)} breaks); ops per graph: {ops}"
            )
        for reason, where in self.graph_breaks[:SHOWN]:
            out.append(f"graph break at {where}: {reason}")
        if len(self.graph_breaks) > SHOWN:
            out.append(f"... and {len(self.graph_breaks) - SHOWN} more graph breaks")
        recompiles = self.count_recompiles()
        if recompiles:
            out.append(f"recompiled {recompiles} times (torch's limit: {_recompile_limit()})")
        return out


def _forward_code(model: nn.Module) -> CodeType | None:
    forward = inspect.unwrap(type(model).forward)
    return getattr(forward, "__code__", None)


def _where(reason: Any) -> str:
    stack = getattr(reason, "user_stack", None) or []
    if not stack:
        return "?"
    frame = stack[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"


def _first_line(text: str) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else "?"


def _explain(model: nn.Module, inputs: tuple, report: CompileReport) -> None:
    with state_restored(model, inputs):
        try:
            out = torch._dynamo.explain(model)(*inputs)
        except Exception as exc:
            raise TransformError(
                f"torch._dynamo.explain failed on the example inputs: {_first_line(exc)}"
            ) from exc
    report.graphs = out.graph_count
    report.graph_breaks = [
        (_first_line(r.reason), _where(r))
        for r in out.break_reasons
        if getattr(r, "graph_break", True)
    ]
    report.ops_per_graph = [len(ops) for ops in out.ops_per_graph or []]


def compile_model(
    model: nn.Module, example_inputs: Any, preset: str = "default", *, explain: bool = True
) -> tuple[nn.Module, CompileReport]:
    """`torch.compile(model, **PRESETS[preset])` and a CompileReport of its graphs, graph
    breaks (when `explain`) and, later, recompiles. Compilation itself happens on the compiled
    module's first call. Raises TransformError for an unknown preset, and when explaining
    fails on the example inputs."""
    if preset not in PRESETS:
        raise TransformError(f"unknown compile preset {preset!r}; known: {', '.join(PRESETS)}")
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    report = CompileReport(preset=preset, options=dict(PRESETS[preset]))
    if explain:
        _explain(model, tuple(inputs), report)
    report.forward = _forward_code(model)
    report.entries_before = _cache_entries(report.forward)
    return torch.compile(model, **report.options), report
