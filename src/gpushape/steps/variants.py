"""The ways one model's training step can run, as `gpushape bench --vs` names them.

A variant is one of the names below or several joined by "+" ("optimize+graph"); whatever the
order written, model rewrites apply first, then the optimizer's, then how the step runs:
- model: `eager` (as given: nothing), `channels-last` (weights and 4-D inputs NHWC),
  `optimize` (`gpushape.optimize` for eager mode, or for graph mode with the `graph` runner:
  the audit's fixes, each checked numerically), `optimize-compile` (the fixes that still pay
  under torch.compile); beside either, a transform's id ("optimize-compile+fuse-qkv"): that
  fix applied by name after the findings' own, kept whatever its prediction;
- step: `fused-optimizer` (the same optimizer with fused=True), `caller-backward` (the
  backward on the calling thread, `torch.autograd.set_multithreading_enabled(False)`, instead
  of autograd's per-device worker thread, where Python runs several times slower),
  `cudnn-benchmark` (torch.backends.cudnn.benchmark on while the variant runs, warms up and is
  captured: cuDNN times its algorithms for each convolution shape once and keeps the fastest,
  where its heuristic picks one otherwise; off again between its steps, so the variants timed
  beside it keep PyTorch's default);
- compile option: `aten-random` (with a compile runner: Inductor's `fallback_random`, random
  numbers drawn by ATen's kernels, as eager draws them, instead of in its generated Triton
  kernels, where each element runs its own Philox rounds: BERT-base's compiled dropout + add +
  LayerNorm forward kernels took about three times what their bytes take at the copy rate),
  `tuned-kernels` (Inductor's `coordinate_descent_tuning`: each generated Triton kernel's
  block sizes and warps searched on the GPU when it is compiled; a longer compile);
- runner: `compile` (torch.compile of the model, optimizer eager), `compile-max-autotune`,
  `compile-graphs` (torch.compile's "reduce-overhead" mode: Inductor replays the compiled
  forward and backward from CUDA graphs; the optimizer eager),
  `graph` (the whole step, forward, backward and optimizer, replayed from one CUDA graph; a
  Hugging Face model whose transformers builds an all-true attention mask while capturing gets
  skip-attention-mask first, which changes no number, so the graph keeps flash attention).
  `graph` may join `compile` or `compile-max-autotune` ("compile+graph"): the model compiled,
  warmed up (which compiles it), then the whole step captured, the optimizer's kernels and the
  gaps between the compiled forward and backward included, which reduce-overhead leaves eager.
Every variant starts from its own deep copy of the model as given, the same batch values, and
a fresh optimizer of the same kind.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError
from .batch import Batch
from .compiling import (
    COMPILE_RUNNERS,
    compiled,
    cudnn_benchmark,
    each_step_graphed,
    inductor_options,
    with_cudnn_benchmark,
)
from .step import TrainingStep, build_step

MODEL_PARTS = ("eager", "channels-last", "optimize", "optimize-compile")
OPTIMIZER_PARTS = ("fused-optimizer", "caller-backward", "cudnn-benchmark")
COMPILE_PARTS = ("aten-random", "tuned-kernels")
RUNNER_PARTS = ("compile", "compile-max-autotune", "compile-graphs", "graph")
PARTS = MODEL_PARTS + OPTIMIZER_PARTS + COMPILE_PARTS + RUNNER_PARTS
CHECK_SAMPLES = 2  # optimize() checks each rewrite on this many samples of the batch
GRAPH_WARMUP = 3  # real steps before a whole-step capture (PyTorch's recipe, on a side stream)


@dataclass
class Variant:
    """A variant ready to time: `run()` is one step."""

    name: str
    step: TrainingStep
    run: Any
    notes: list[str] = field(default_factory=list)
    optimize_report: Any = None
    build_s: float = 0.0
    """Seconds to build it: the copy, the rewrites and their checks, a CUDA graph's capture."""
    steps_run: int = 0
    """Real training steps the build took (a whole-step CUDA graph's warm-up before capture)."""


def parse_variant(name: str) -> list[str]:
    parts = [p.strip() for p in name.split("+") if p.strip()]
    unknown = [p for p in parts if p not in PARTS and not _transform_id(p)]
    if not parts or unknown:
        raise GpushapeError(
            f"unknown variant {name!r}: parts are {', '.join(PARTS)}, or a transform's id "
            f"beside optimize or optimize-compile (`gpushape optimize --help` lists them), "
            f"joined by '+'"
        )
    named = [p for p in parts if p not in PARTS]
    if named and not {"optimize", "optimize-compile"} & set(parts):
        raise GpushapeError(
            f"variant {name!r}: {named[0]} is a transform: name it beside optimize or "
            f"optimize-compile, which then apply it too, whatever its prediction"
        )
    runners = [p for p in parts if p in RUNNER_PARTS]
    if len(runners) > 1 and not _compiled_in_graph(runners):
        raise GpushapeError(
            f"variant {name!r} names {len(runners)} runners; pick one of them (or graph with "
            f"compile or compile-max-autotune: the compiled step captured whole)"
        )
    option = next((p for p in parts if p in COMPILE_PARTS), None)
    if option and not any(p in COMPILE_RUNNERS for p in runners):
        raise GpushapeError(
            f"variant {name!r}: {option} is an option of torch.compile; add one of "
            f"{', '.join(COMPILE_RUNNERS)}"
        )
    models = [p for p in parts if p in MODEL_PARTS and p != "eager"]
    if len(models) > 1 and set(models) >= {"optimize", "optimize-compile"}:
        raise GpushapeError(f"variant {name!r}: optimize and optimize-compile exclude each other")
    return parts


def _transform_id(part: str) -> bool:
    from ..transforms import load_transforms

    return part in load_transforms()


def _compiled_in_graph(runners: list[str]) -> bool:
    """graph joined with compile or compile-max-autotune (not compile-graphs: a CUDA graph
    cannot capture another's replay)."""
    return (
        len(runners) == 2
        and "graph" in runners
        and bool({"compile", "compile-max-autotune"} & set(runners))
    )


@dataclass(frozen=True)
class Spec:
    """What a variant does, part by part (`parse_variant` reads one from its name)."""

    channels_last: bool = False
    optimize_mode: str | None = None
    """"eager", "compile" or "graph": run gpushape.optimize for that mode; None: no rewrite."""
    transforms: tuple[str, ...] | None = None
    """The transforms optimize may apply (None: the ones the findings name)."""
    fused_optimizer: bool = False
    caller_backward: bool = False
    """The backward on the calling thread, not autograd's per-device worker thread."""
    cudnn_benchmark: bool = False
    """torch.backends.cudnn.benchmark on while the variant's steps run (and are captured)."""
    runner: str = "eager"
    """eager, compile, compile-max-autotune, compile-graphs or graph."""
    compile_first: str | None = None
    """With the graph runner: compile or compile-max-autotune, the model compiled before the
    whole step (forward, backward, optimizer) is captured in one CUDA graph."""
    aten_random: bool = False
    """Compiled: Inductor's fallback_random (ATen draws the random numbers)."""
    tuned_kernels: bool = False
    """Compiled: Inductor's coordinate_descent_tuning (each Triton kernel's launch tuned)."""
    also: tuple[str, ...] = ()
    """Transforms optimize applies by name after the findings' fixes, kept whatever their
    prediction (the variant "optimize-compile+fuse-qkv": a fix optimize rolled back, timed)."""
    quiet_sites: bool = False
    """With `transforms`: leave alone the sites whose finding saves nothing in the mode, as
    optimize does with the findings' own fixes (the loop's stages rebuild its plan)."""

    @classmethod
    def of(cls, name: str) -> Spec:
        parts = parse_variant(name)
        mode = (
            "compile" if "optimize-compile" in parts else "eager" if "optimize" in parts else None
        )
        runners = [p for p in parts if p in RUNNER_PARTS]
        runner = "graph" if "graph" in runners else next(iter(runners), "eager")
        if mode == "eager" and runner == "graph":
            mode = "graph"  # the fixes that pay, and can be captured, in a CUDA graph
        return cls(
            channels_last="channels-last" in parts,
            optimize_mode=mode,
            fused_optimizer="fused-optimizer" in parts,
            caller_backward="caller-backward" in parts,
            cudnn_benchmark="cudnn-benchmark" in parts,
            runner=runner,
            compile_first=next((p for p in runners if p in COMPILE_RUNNERS), None)
            if runner == "graph"
            else None,
            aten_random="aten-random" in parts,
            tuned_kernels="tuned-kernels" in parts,
            also=tuple(p for p in parts if p not in PARTS),
        )


def build_variant(
    name: str,
    model: nn.Module,
    batch: Batch,
    *,
    optimizer: str = "auto",
    gpu: Any = None,
    spec: Spec | None = None,
) -> Variant:
    """A deep copy of `model` made into variant `name` (or `spec`, when given), with its step."""
    spec = spec or Spec.of(name)
    t0 = time.perf_counter()
    model = copy.deepcopy(model)
    batch = copy.copy(batch)
    notes: list[str] = []
    report = None
    if spec.channels_last:
        model, batch = _channels_last(model, batch)
        notes += _guard_pools(model, batch)
    if spec.optimize_mode:
        model, report = _optimized(
            model, batch, gpu, spec.optimize_mode, spec.transforms, spec.quiet_sites
        )
        if spec.also:
            model, named = _optimized(model, batch, gpu, spec.optimize_mode, spec.also)
            report = _merged(report, named)
        notes.append(_applied(report))
    step = build_step(model, batch, optimizer)
    if spec.fused_optimizer:
        notes.append(_fuse(step))
    if spec.caller_backward:
        step.caller_backward = True
        notes.append("backward on the calling thread")
    run: Any = step
    steps_run = 0
    compile_runner = spec.compile_first or spec.runner
    if compile_runner in ("compile", "compile-max-autotune"):
        mode = "max-autotune" if compile_runner == "compile-max-autotune" else None
        step.forward = compiled(model, mode, inductor_options(spec))
    if spec.runner == "compile-graphs":
        graphed = compiled(model, "reduce-overhead", inductor_options(spec))
        step.forward = each_step_graphed(graphed)
    if spec.aten_random:
        notes.append("random numbers drawn by ATen (Inductor's fallback_random)")
    if spec.tuned_kernels:
        notes.append("Triton kernels tuned when compiled (Inductor's coordinate_descent_tuning)")
    if spec.runner == "graph":
        notes += _mask_for_capture(step.model, batch)
        with cudnn_benchmark(spec.cudnn_benchmark):  # the algorithms the graph keeps
            run = _graphed(step)
        steps_run = GRAPH_WARMUP
        notes.append(
            f"whole step in one CUDA graph{', the model compiled' if spec.compile_first else ''}"
        )
        notes += _graph_warnings(step.model)
    if spec.cudnn_benchmark:
        run = with_cudnn_benchmark(run)
        notes.append("cuDNN's algorithms timed per shape (torch.backends.cudnn.benchmark)")
    return Variant(name, step, run, notes, report, time.perf_counter() - t0, steps_run)


def _channels_last(model: nn.Module, batch: Batch) -> tuple[nn.Module, Batch]:
    model = model.to(memory_format=torch.channels_last)
    batch.inputs = tuple(
        x.contiguous(memory_format=torch.channels_last)
        if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point()
        else x
        for x in batch.inputs
    )
    return model, batch


def _guard_pools(model: nn.Module, batch: Batch) -> list[str]:
    """The channels-last variant's padded `nn.AvgPool2d`s guarded where PyTorch's channels_last
    backward of them is wrong on the model's device (transforms/safe_avg_pool.py,
    pytorch#188344): a baseline that trains on wrong gradients is no baseline. A note says so."""
    from ..transforms import get_transform, load_transforms
    from ..transforms._core import TransformContext
    from ..transforms.safe_avg_pool import ISSUE, needed

    if not needed(model, batch.inputs):
        return []
    load_transforms()
    out = get_transform("safe-avg-pool").apply(model, TransformContext(example_inputs=batch.inputs))
    return [f"{len(out.changes)} padded AvgPool2d guarded ({ISSUE}: channels_last gradients)"]


def _optimized(
    model: nn.Module, batch: Batch, gpu: Any, mode: str, transforms=None, quiet_sites=False
):
    """gpushape.optimize at the benchmark's batch (what the audit prices), each rewrite checked
    on CHECK_SAMPLES samples of it (the check runs the model in float64)."""
    from ..transforms import optimize

    small = tuple(
        x[:CHECK_SAMPLES].clone() if isinstance(x, torch.Tensor) and x.dim() else x
        for x in batch.inputs
    )
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    transforms = list(transforms) if transforms is not None else None
    return optimize(model, batch.inputs, gpu, train=True, dtype=dtype, mode=mode,
                    transforms=transforms, verify_inputs=small,
                    quiet_sites=quiet_sites or transforms is None)  # fmt: skip


def _merged(first: Any, named: Any) -> Any:
    """optimize's report of the findings' fixes, with the fixes then applied by name: those
    count as applied, not rolled back; the audit after is the second's."""
    kept = {c.transform for c in named.applied}
    first.applied += named.applied
    first.rolled_back = [r for r in first.rolled_back if r.transform not in kept]
    first.rolled_back += named.rolled_back
    first.refused += named.refused
    first.verified.update(named.verified)
    first.after = named.after
    return first


def _applied(report: Any) -> str:
    names = sorted({c.transform for c in report.applied})
    rolled = [r.transform for r in report.rolled_back]
    text = f"optimize ({report.mode}): applied {', '.join(names) or 'nothing'}"
    return text + (f"; rolled back {', '.join(rolled)}" if rolled else "")


def _fuse(step: TrainingStep) -> str:
    from ..transforms.fused_optimizer import fuse_optimizer

    step.optimizer, what = fuse_optimizer(step.optimizer)
    return what


def _mask_for_capture(model: nn.Module, batch: Batch) -> list[str]:
    """skip-attention-mask on a Hugging Face model whose transformers builds an all-true
    attention mask while a stream captures (a captured step would leave flash attention for
    nothing); the note saying so, or none."""
    from ..models.hf_masks import cache_setting, packed_mask_gap, traced_mask_gap
    from ..transforms import TransformContext, get_transform

    uncached = cache_setting(model) is False
    if traced_mask_gap(model) is None and (not uncached or packed_mask_gap(model) is None):
        return []
    ctx = TransformContext(example_inputs=tuple(batch.inputs), mode="graph")
    outcome = get_transform("skip-attention-mask").apply(model, ctx)
    return [f"skip-attention-mask for the capture: {c.detail}" for c in outcome.changes]


def _graph_warnings(model: nn.Module) -> list[str]:
    from ..transforms.cuda_graph import capture_warnings

    return capture_warnings(model)


def _graphed(step: TrainingStep):
    from ..transforms.cuda_graph import capture_reasons, capture_step, make_capturable

    step.optimizer = make_capturable(step.optimizer)
    reasons = capture_reasons(step.model, step.optimizer, step.batch.tensors())
    if reasons:
        raise GpushapeError(f"graph: cannot capture this step: {reasons[0]}")
    return capture_step(step.backward_and_update, optimizer=step.optimizer, warmup=GRAPH_WARMUP)
