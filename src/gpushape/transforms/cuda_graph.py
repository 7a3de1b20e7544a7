"""cuda-graphs: the whole training step (forward, backward, optimizer) captured in one CUDA graph.

A step of many short kernels is paced by the CPU launching them (the launch-bound rule prices
it); a graph replays the same kernels with one launch. It replays exactly what was captured:
the same kernels on the same memory, so every input lives in a static tensor that new batches
are copied into, and nothing in the step may read a GPU value on the host (`.item()`, printing
a tensor, a branch on a tensor), synchronise, or change shape.

The recipe is PyTorch's whole-network capture: a few warm-up steps on a side stream (lazy
state, cuBLAS workspaces and autotuning happen outside the graph), gradients set to None, then
one step captured. Backward allocates the gradients during capture, from the graph's private
memory pool, and each replay writes them afresh; they stay valid as long as the graph does.
For that the gradients must be None when capture starts: pass the optimizer to `capture_step`
(it calls `zero_grad(set_to_none=True)` before each warm-up step and before capturing), or
zero them first thing inside the step with `set_to_none=True`. Not with set_to_none=False: the
graph would capture a memset of gradients the warm-up allocated outside its pool, and write
into memory it does not own, which the next `zero_grad()` (set_to_none=True by default) frees
for anything else to take.

The optimizer must keep its step count on the GPU: torch.optim's Adam, AdamW and the others
with a `capturable` option refuse capture without it (fused ones too); SGD keeps no count.
`capture_reasons` lists what it can check before trying; `make_capturable` rebuilds an
optimizer with capturable=True, state kept. A float learning rate is baked into the graph: to
schedule it, construct the optimizer with a CUDA tensor lr (capturable or fused) and update
that tensor in place.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._core import TransformError, has_hooks
from .fused_optimizer import rebuild

SHOWN = 3  # names listed per reason before "and N more"


class GraphCaptureError(TransformError):
    """A step that cannot be captured in a CUDA graph, or a replay given inputs it cannot take."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _off_cuda(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    return [f"{n} ({t.device.type})" for n, t in named if t.device.type != "cuda"]


def _optimizer_reasons(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> list[str]:
    name = type(optimizer).__name__
    takes = "capturable" in inspect.signature(type(optimizer).__init__).parameters
    reasons = []
    if takes and not all(g.get("capturable") for g in optimizer.param_groups):
        fused = any(g.get("fused") for g in optimizer.param_groups)
        fused = " (fused needs it too)" if fused else ""
        reasons.append(
            f"{name} is not capturable{fused}: its step count lives on the CPU; construct it "
            "with capturable=True or use make_capturable(optimizer)"
        )
    elif isinstance(optimizer, torch.optim.LBFGS):
        reasons.append("LBFGS re-evaluates a closure and reads losses on the host: not capturable")
    elif isinstance(optimizer, torch.optim.Adagrad) and not all(
        g.get("fused") for g in optimizer.param_groups
    ):
        reasons.append(
            "Adagrad keeps its step count on the CPU and has no capturable option: construct it "
            "with fused=True, or use SGD or AdamW(capturable=True)"
        )
    stray = [
        f"{names.get(id(p), '?')}'s {key}"
        for g in optimizer.param_groups
        for p in g["params"]
        for key, v in optimizer.state.get(p, {}).items()
        if isinstance(v, torch.Tensor) and p.device.type == "cuda" and v.device.type != "cuda"
    ]
    if stray and not reasons:
        reasons.append(
            f"{name} keeps state on the CPU, which a replay would not update: {_listed(stray)}"
        )
    return reasons


def capture_reasons(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None, inputs: Any = ()
) -> list[str]:
    """Every reason, one line each, why a training step of `model` (with `optimizer`, on
    `inputs`) cannot be captured in a CUDA graph, as far as it can be checked without running
    it; empty when nothing stands in the way. What only running can show (a `.item()` or a sync
    inside the step, shapes that change) `capture_step` reports."""
    reasons = [] if torch.cuda.is_available() else ["no CUDA device: CUDA graphs need one"]
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    off = _off_cuda(tensors)
    if off:
        reasons.append(f"{len(off)} parameters/buffers are not on CUDA: {_listed(off)}")
    leaves = torch.utils._pytree.tree_leaves(inputs)
    named = [(f"input {i}", t) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    off = _off_cuda(named)
    if off:
        reasons.append(
            f"{len(off)} inputs are not on CUDA (the graph reads static CUDA tensors): "
            f"{_listed(off)}"
        )
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        reasons += _optimizer_reasons(optimizer, names)
    return reasons


def capture_warnings(model: nn.Module) -> list[str]:
    """What captures but behaves differently when replayed, one line each: modules with
    forward or backward hooks (a hook's Python runs once, while capturing; replays run only the
    kernels it launched then); a Hugging Face model whose transformers release builds an
    explicit all-true attention mask while a stream captures (`models/hf_masks.py`), which keeps
    SDPA off its flash kernel (measured on the H200: GPT-2's captured step ran 966 kernels and
    32.1 ms of GPU time against 611 and 26.7 eager); the skip-attention-mask fix removes it."""
    from ..models.hf_masks import cache_setting, packed_mask_gap, traced_mask_gap

    out = []
    hooked = [fqn or type(model).__name__ for fqn, m in model.named_modules() if has_hooks(m)]
    if hooked:
        out.append(f"hooks run only while capturing, not on replays: {_listed(hooked)}")
    if traced_mask_gap(model) is not None:
        out.append(
            "transformers builds an explicit attention mask while a stream captures, so SDPA "
            "leaves its flash kernel: apply skip-attention-mask first (gpushape optimize "
            "--mode graph does)"
        )
    if cache_setting(model) is False and packed_mask_gap(model) is not None:
        out.append(
            "with use_cache=False transformers builds an explicit causal mask while a stream "
            "captures (its check for packed sequences), so SDPA leaves its flash kernel: apply "
            "skip-attention-mask first (gpushape optimize --mode graph does)"
        )
    return out


class GraphedStep:
    """A captured step: `graphed(*new_inputs)` copies each new tensor into its static input,
    replays the graph and returns the step's outputs, the same static tensors every time
    (overwritten by the next replay: clone what must be kept). `graphed()` replays on whatever
    the static inputs hold. It holds the step function and the static inputs, since the graph
    reads their memory; drop it to free the graph's pool."""

    def __init__(self, graph, step_fn: Callable, static_inputs: tuple, static_outputs: Any):
        self.graph = graph
        self.step_fn = step_fn
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs

    def pool(self):
        """The graph's memory pool handle, for capturing another graph that shares it."""
        return self.graph.pool()

    def _copy_in(self, new_inputs: tuple) -> None:
        if len(new_inputs) != len(self.static_inputs):
            raise GraphCaptureError(
                f"the step was captured with {len(self.static_inputs)} inputs, "
                f"got {len(new_inputs)}"
            )
        for i, (static, new) in enumerate(zip(self.static_inputs, new_inputs)):
            if not isinstance(new, torch.Tensor):
                raise GraphCaptureError(f"input {i} is a {type(new).__name__}, not a tensor")
            if new.shape != static.shape or new.dtype != static.dtype:
                raise GraphCaptureError(
                    f"input {i} is {tuple(new.shape)} {new.dtype}, the graph was captured with "
                    f"{tuple(static.shape)} {static.dtype}: capture another step for that shape"
                )
        for static, new in zip(self.static_inputs, new_inputs):
            if new is not static:
                static.copy_(new, non_blocking=True)

    def __call__(self, *new_inputs: torch.Tensor) -> Any:
        if new_inputs:
            self._copy_in(new_inputs)
        self.graph.replay()
        return self.static_outputs


def _warm_up(step_fn: Callable, static_inputs: tuple, warmup: int, optimizer) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            step_fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)


def _recover_generator() -> None:
    """A capture whose end fails skips torch's epilogue for the device's random generator, which
    stays marked as capturing: every random op on the device would fail from then on. Swap in
    a copy of its state (same seed and offset, not capturing)."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    with contextlib.suppress(AttributeError, RuntimeError):  # a torch without graph-safe RNG
        generator.graphsafe_set_state(generator.clone_state())


def _capture(graph, step_fn: Callable, static_inputs: tuple, pool) -> Any:
    failure: BaseException | None = None
    outputs = None
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool):
            try:
                outputs = step_fn(*static_inputs)
            except Exception as exc:  # ends the capture cleanly before reporting
                failure = exc
    except Exception as exc:  # capture_end on an invalidated capture
        failure = failure or exc
    if failure is not None:
        torch.cuda.set_stream(stream)  # a failed capture_end leaves its capture stream current
        _recover_generator()
        raise GraphCaptureError(f"cannot capture this step: {_first_line(failure)}") from failure
    return outputs


def capture_step(
    step_fn: Callable,
    *static_inputs: torch.Tensor,
    warmup: int = 3,
    pool=None,
    optimizer: torch.optim.Optimizer | None = None,
) -> GraphedStep:
    """Capture `step_fn(*static_inputs)`, one whole training step, in a CUDA graph (see the
    module docstring for the recipe). The `warmup` calls before the capture are real steps on
    the static inputs (they update the parameters); the capture itself computes nothing.
    `optimizer`, when given, has its gradients set to None before each warm-up step and before
    the capture, so step_fn need not zero them (without it, step_fn must zero them first thing,
    with set_to_none=True, or every replay adds to the last one's). `pool` shares another
    graph's memory pool (`GraphedStep.pool()`). Raises GraphCaptureError without CUDA, for
    inputs that are not CUDA tensors, and when the capture fails (the error chained)."""
    if not torch.cuda.is_available():
        raise GraphCaptureError("capture_step needs a CUDA device; this machine has none")
    if warmup < 0:
        raise GraphCaptureError(f"warmup must be 0 or more, got {warmup}")
    for i, t in enumerate(static_inputs):
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            what = t.device.type if isinstance(t, torch.Tensor) else type(t).__name__
            raise GraphCaptureError(
                f"static input {i} is not a CUDA tensor ({what}): pass CUDA tensors, and bind "
                "other arguments in step_fn (functools.partial)"
            )
    _warm_up(step_fn, static_inputs, warmup, optimizer)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    outputs = _capture(graph, step_fn, static_inputs, pool)
    return GraphedStep(graph, step_fn, static_inputs, outputs)


def make_capturable(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` rebuilt with capturable=True (same class and param_groups; state carried
    over, step counts moved to the parameters' device), or the same object when it already is
    capturable or keeps no step count (SGD). Raises GraphCaptureError for classes without a
    capturable option."""
    if isinstance(optimizer, torch.optim.SGD):
        return optimizer
    name = type(optimizer).__name__
    takes = "capturable" in inspect.signature(type(optimizer).__init__).parameters
    if not isinstance(optimizer, torch.optim.Optimizer) or not takes:
        raise GraphCaptureError(
            f"{name} has no capturable option: use SGD or an optimizer that has one "
            "(Adam, AdamW, ...) for a captured step"
        )
    if all(g.get("capturable") for g in optimizer.param_groups):
        return optimizer
    return rebuild(optimizer, capturable=True)
