"""The loop's predictions: each stage's step (GPU seconds, wall seconds) as the cost model
prices it, whose differences are the fixes' predicted savings (`fix_by_fix.loop`).

Every stage is the audit of its own model in the loop's mode, with the step's optimizer;
what an audit of the model cannot see is priced apart:
- the optimizer's fix by its finding in the last audited stage (on a stage built on
  graph-layers, on that stage's host: `graph_layers_host.fused_step`);
- a stage built on graph-layers as the eager step with the captured layers' dispatch replaced
  by their replays (`graph_layers_host.stage_step`; graph mode where the profile lacks the
  rates), less the GEMV bias gradients those layers take;
- a whole-step CUDA graph by the audit's graph mode of its model, with the optimizer it steps
  (fused after `+ fused-optimizer`: the audit prices the fused kernels, so that saving is not
  counted again);
- compile mode's reduce-overhead as the compiled GPU work of the stage before, launched from
  graphs (`auditing.modes.compile_graphs_step`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .graph_layers_host import fused_step, stage_step, whole_graph_step
from .loop_plan import GRAPH_LAYERS

GIVEN = "as given"
NONE = (0.0, 0.0, [])  # no finding names the fix
# graph-layers captures the layers only: the model's attention mask is built eagerly outside
# them, so a captured step's all-true mask (materialized-attention-mask) is not in its stages
NOT_IN_LAYER_CAPTURE = ("materialized-attention-mask",)


def predictions(report: Any) -> dict[str, tuple[float, float, list[str]]]:
    """fix -> (GPU saving, wall saving, findings), each finding priced alone."""
    out: dict[str, tuple[float, float, list[str]]] = {}
    for f in report.findings:
        if not f.fix or not f.est_saving_s:
            continue
        gpu, wall, names = out.get(f.fix, (0.0, 0.0, []))
        wall_f = f.evidence.get("wall_saving_s", f.est_saving_s)
        out[f.fix] = (gpu + f.est_saving_s, wall + wall_f, [*names, f.label])
    return out


def model_dtype(model: nn.Module):
    """The dtype of the model's first floating-point parameter (None: it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _step_of(report: Any) -> tuple[float, float]:
    """The audited step (GPU, wall)."""
    step = report.step
    if step is None:
        return (report.totals.roofline_time_s,) * 2
    return step.gpu_s, step.wall_s


def expected_steps(specs, built, report, predicted, gpu, mode) -> dict[str, tuple[float, float]]:
    """Each built stage's predicted (GPU, wall) step: the audit of its model in `mode`; the
    optimizer's fix from its findings; a CUDA graph as the audit's graph mode of the stage
    before (masked-lm-head has no host sync, so a graph captures it), compiled
    (reduce-overhead) as the stage before's compiled GPU work with the graph's launches."""
    from ..auditing.api import audit
    from ..auditing.modes import compile_graphs_step, compiled_stage
    from ..auditing.registry import load_rules

    out: dict[str, tuple[float, float]] = {GIVEN: _step_of(report)}
    reports = {GIVEN: report}
    partly_steps: dict[str, Any] = {}  # stages priced as graph-layers runs them
    previous = GIVEN
    for stage, spec in specs.items():
        if stage == GIVEN or stage not in built:
            continue
        step = built[stage].step
        if stage == "+ fused-optimizer":  # priced on the last audited stage, as it runs there
            last = predictions(list(reports.values())[-1])
            gpu_s, wall_s, _ = last.get("fused-optimizer", predicted.get("fused-optimizer", NONE))
            out[stage] = (out[previous][0] - gpu_s, out[previous][1] - wall_s)
            if previous in partly_steps:  # graph-layers' step: its host, not the eager audit's
                after = fused_step(
                    partly_steps[previous], built[previous].step.optimizer, gpu_s, gpu
                )
                out[stage], partly_steps[stage] = (out[previous][0] - gpu_s, after.wall_s), after
        elif spec.runner == "compile-graphs":  # the compiled kernels, launched from graphs
            graphed = audit(step.model, step.batch.inputs, gpu, dtype=model_dtype(step.model),
                            train=True, mode="graph", optimizer=step.optimizer)  # fmt: skip
            gpu_s = out[previous][0]
            last = list(reports.values())[-1]  # the kernels the graphs replay
            replayed = compile_graphs_step(last.step, graphed.step, gpu, gpu_s, last.boundary_bytes)
            out[stage] = (replayed.gpu_s, replayed.wall_s)  # the copies into static inputs too
        else:
            # graph-layers replays the layers from CUDA graphs: its stage and every stage built
            # on it priced as the audit's graph mode (their layers' dispatch is replayed too)
            graphed = spec.runner == "graph" or GRAPH_LAYERS in spec.transforms
            layers_only = graphed and spec.runner != "graph"
            rules = (
                [r for r in load_rules() if r not in NOT_IN_LAYER_CAPTURE] if layers_only else None
            )
            # graph-layers: the eager step with the captured layers' dispatch replaced by their
            # replays, where the profile has the rates (graph_layers_host.py); else graph mode
            partly = stage_step(built[stage], gpu, rules) if layers_only else None
            run_mode = "graph" if graphed else mode
            if partly is not None:
                stage_report, graphed_step = partly
                partly_steps[stage] = graphed_step
            else:
                stage_report = audit(step.model, step.batch.inputs, gpu,
                                     dtype=model_dtype(step.model), train=True, mode=run_mode,
                                     optimizer=step.optimizer, rules=rules)  # fmt: skip
                graphed_step = stage_report.step
                if graphed and graphed_step is not None:  # graph-layers' GEMV bias gradients
                    graphed_step = whole_graph_step(built[stage], gpu, graphed_step)
            gpu_s, wall_s = _step_of(stage_report) if graphed_step is None else (
                graphed_step.gpu_s, graphed_step.wall_s)  # fmt: skip
            if run_mode == "compile" and report.step is not None and stage_report.step:
                # the host as given, less the kernels removed at its cost per kernel
                compiled = compiled_stage(report.step, stage_report.step)
                gpu_s, wall_s = compiled.gpu_s, compiled.wall_s
            # a whole-step graph after "+ fused-optimizer" is audited with the fused optimizer
            # its step runs: the audit prices the fused kernels, so their saving is not taken
            # off again (BERT-base on an H100: 1.17 ms of its graph's 1.99 predicted, 0.12
            # measured, was that saving counted twice)
            out[stage] = (gpu_s, wall_s)
            reports[stage] = stage_report
        previous = stage
    return out
