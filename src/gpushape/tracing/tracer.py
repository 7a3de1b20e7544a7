"""`trace(model, example_inputs, train=False, device=None) -> Trace`: the entry point."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import GpushapeError
from .handover import hand_overs
from .inputs import meta_stand_ins, model_device_types, model_tensors, place, split_inputs
from .recorder import ModuleStack, Recorder, TraceError, failure_message
from .records import Trace
from .routing import GpuKernelRouting


def trace(
    model: nn.Module,
    example_inputs: Any,
    train: bool = False,
    device: str | torch.device | None = None,
    *,
    name: str | None = None,
) -> Trace:
    """Run `model` once on `example_inputs` and record every aten op.

    example_inputs: a tensor, a `TensorSpec`, a tuple/list of them (positional arguments) or a
        dict (keyword arguments); other values are passed through unchanged.
    train: False runs `model.eval()` under `torch.no_grad()`; True runs `model.train()`, the
        forward with grad, then the backward of every output that requires grad (seeded with
        ones) to the parameters and to any example input that requires grad. The model's own
        train/eval mode is restored afterwards; `.grad` is never touched.
    device: None or "meta" (default) traces on the meta device: no memory, no compute, real
        weights swapped for meta stand-ins during the call, SDPA and dropout routed to the fused
        kernels a GPU would run. "cpu"/"cuda" run for real on that device; the model must be there.
    name: the model's name in the trace (default: its class name).

    Raises TraceError (a GpushapeError) naming the op and module when the model cannot run.
    """
    if not isinstance(model, nn.Module):
        raise GpushapeError(f"trace() needs an nn.Module, got {type(model).__name__}")
    target = _target_device(model, device)
    args, kwargs = split_inputs(example_inputs)
    args, kwargs = place(args, target), place(kwargs, target)
    stand_ins = None
    if target.type == "meta" and model_device_types(model) - {"meta"}:
        stand_ins = meta_stand_ins(model)
    tensors = stand_ins if stand_ins is not None else dict(model_tensors(model))
    module_types = {path: type(m).__name__ for path, m in model.named_modules()}
    param_modules = {id(t): path.rpartition(".")[0] for path, t in tensors.items()}
    stack = ModuleStack(model)
    recorder = Recorder(stack, module_types, param_modules, target.type)
    was_training = model.training
    leaves: list[torch.Tensor] = []
    model.train(train)
    try:
        with contextlib.ExitStack() as scope:
            scope.enter_context(stack.installed())
            if target.type == "meta":
                scope.enter_context(GpuKernelRouting())
            scope.enter_context(recorder)
            out = _forward(model, args, kwargs, stand_ins, train, stack, target.type)
            if train:
                leaves = _grad_leaves(tensors.values(), (args, kwargs))
                _backward(out, leaves, recorder)
    finally:
        model.train(was_training)
    crossing = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if train:
        crossing += _differentiable(out)
    return Trace(
        model=name or type(model).__name__,
        train=train,
        device=target.type,
        ops=hand_overs(recorder.ops) if train and target.type == "meta" else recorder.ops,
        modules=module_types,
        grad_leaves=len(leaves),
        boundary_bytes=sum(t.numel() * t.element_size() for t in crossing),
    )


def _target_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    try:
        target = torch.device("meta" if device is None else device)
    except (RuntimeError, TypeError) as exc:
        raise GpushapeError(f"bad device {device!r}: {exc}") from exc
    if target.type == "meta":
        return target
    kinds = model_device_types(model)
    if "meta" in kinds:
        raise TraceError(
            f"the model's weights are on the meta device, so it cannot run on "
            f"{target}: build it on {target} to trace with real tensors"
        )
    if kinds - {target.type}:
        raise TraceError(
            f"the model is on {', '.join(sorted(kinds))}; move it to {target} "
            f"first, or trace on meta (device=None)"
        )
    return target


def _forward(model, args, kwargs, stand_ins, train, stack: ModuleStack, device: str):
    grad = torch.enable_grad() if train else torch.no_grad()
    try:
        with grad:
            if stand_ins is None:
                return model(*args, **kwargs)
            return torch.func.functional_call(
                model, stand_ins, args, kwargs, tie_weights=True, strict=False
            )
    except GpushapeError:
        raise
    except Exception as exc:  # raised by the model's Python code, not by an aten op
        module, mtype = stack.failed_in or stack.stack[-1]
        raise TraceError(failure_message(None, module, mtype, "forward", device, exc)) from exc


def _grad_leaves(params, inputs) -> list[torch.Tensor]:
    """What a training step's backward computes gradients for: the parameters that require
    grad, and example inputs that do (as `loss.backward()` would)."""
    leaves = [t for t in params if t.requires_grad]
    seen = {id(t) for t in leaves}
    for t in pytree.tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf and id(t) not in seen:
            leaves.append(t)
            seen.add(id(t))
    return leaves


def _differentiable(out: Any) -> list[torch.Tensor]:
    """The model's outputs a backward starts from: tensors that require grad."""
    return [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor)
        and t.requires_grad
        and (t.is_floating_point() or t.is_complex())
    ]


def _backward(out: Any, leaves: list[torch.Tensor], recorder: Recorder) -> None:
    outs = _differentiable(out)
    if not outs:
        raise TraceError(
            "train=True, but no output of the model requires grad (are its "
            "parameters frozen, or is the forward run under no_grad?)"
        )
    if not leaves:
        raise TraceError("train=True, but the model has no parameter that requires grad")
    with recorder.pause():
        seeds = [torch.ones_like(t) for t in outs]
    recorder.phase = "backward"
    torch.autograd.grad(outs, leaves, seeds, allow_unused=True)
