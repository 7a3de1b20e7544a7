"""`gpushape.audit(model, example_inputs, gpu=None, ...) -> Report`: the whole audit.

    report = gpushape.audit(model, (x,), gpu="h200", dtype=torch.bfloat16, train=True,
                            optimizer=opt, dataloader=loader)
    for f in report.findings: print(f.severity.label, f.rule, f.module, f.message)
    report.to_html("report.html")

The model is traced once on the meta device (no memory, no compute: a 70B model audits on a
laptop), every op is costed on the target chip, and every registered rule reads the result.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError
from ..hardware import GPUSpec, dtype_key
from ..models.hf_masks import meta_padding_masks
from ..models.labels import with_labels
from ..tracing.cost import cost
from ..tracing.tracer import trace
from .cast import channels_last_as, inputs_as, model_as
from .combine import combine
from .context import AuditContext, BackendFlags
from .layout_check import checked_layout
from .modes import check_mode, in_mode, inductor_layout_opt, step_time
from .observe import observe
from .registry import run_rules
from .report.core import Report
from .report.header import describe_inputs
from .target import AUTO, Target, resolve_target


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype most of the model's floating-point parameters have (fp32 when none)."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.__getitem__) if counts else torch.float32


def dtype_label(dtype: torch.dtype, flags: BackendFlags) -> str:
    """'bf16', 'fp16', 'fp32' or 'tf32' (fp32 tensors with TF32 math)."""
    if flags.autocast:
        return flags.autocast
    key = dtype_key(dtype)
    if key == "fp32" and flags.math_mode() == "tf32":
        return "tf32"
    return key


def audit(
    model: nn.Module,
    example_inputs: Any,
    gpu: GPUSpec | Target | str | None = None,
    dtype: torch.dtype | None = torch.bfloat16,
    train: bool = True,
    optimizer: Any = None,
    dataloader: Any = None,
    *,
    profile: Any = AUTO,
    flags: BackendFlags | None = None,
    rules: list[str] | None = None,
    name: str | None = None,
    device: str | None = None,
    mode: str = "eager",
) -> Report:
    """Audit `model` on `example_inputs` for `gpu`.

    dtype: the dtype the model trains/runs in; a model in another dtype is audited as a meta
        copy cast to it (the model itself is not touched). None: as the model is.
    train: a training step (forward and backward) or inference (forward only).
    optimizer, dataloader: optional; rules about them (optimizer-not-fused, dataloader) read
        their settings only.
    gpu: a catalog name, a GPUSpec, or a `target.Target` (a chip already resolved with its
        profile, as the CLI passes it). None: the chip a `profile` file was measured on, else
        the CUDA GPU present when the catalog has it, else h100 (`target.default_gpu`); the
        report's header says which and why.
    profile: "auto" applies the profile shipped for the chip (the H100's, the H200's), a path that
        profile, None the datasheet.
    flags: TF32 and autocast settings; default: this process's torch.backends settings.
    rules: rule ids to run (default: all).
    mode: how the model will run, "eager", "compile" or "graph" (`modes.py`): findings whose
        fix that mode already makes save nothing there; savings get their wall-clock share.
    """
    check_mode(mode)
    if not isinstance(model, nn.Module):
        raise GpushapeError(f"audit() needs an nn.Module, got {type(model).__name__}")
    target = resolve_target(gpu, profile)
    spec = target.spec
    flags = flags or BackendFlags.current()
    # a library model computes its loss in its forward when given labels, as training does
    labelled = with_labels(model, example_inputs) if train else example_inputs
    with_loss = labelled is not example_inputs
    if dtype is not None:
        model = model_as(model, dtype)
        example_inputs, labelled = inputs_as(example_inputs, dtype), inputs_as(labelled, dtype)
    name = name or type(model).__name__
    traced = None
    for inputs in (labelled, example_inputs) if with_loss else (example_inputs,):
        try:
            with observe(model) as seen, meta_padding_masks(model) as checks:
                traced = trace(model, inputs, train=train, device=device, name=name)
            seen.packing_checks = checks.packing
            example_inputs = inputs
            break
        except GpushapeError:
            if inputs is example_inputs:
                raise
            with_loss = False  # its loss does not trace (a host sync in it): the step without

    def context(traced: Any, model: nn.Module, seen: Any) -> AuditContext:
        return AuditContext(
            trace=traced,
            cost=cost(traced, spec, math=flags.math_mode()),
            gpu=spec,
            model=model,
            observed=seen,
            optimizer=optimizer,
            dataloader=dataloader,
            flags=flags,
            profile=target.calibration,
            measured=target.measured,
        )

    layout: list | None = None  # nchw-conv of the model as given, where Inductor converts it
    if mode == "compile" and device in (None, "meta") and inductor_layout_opt(traced)[0]:
        # Inductor's layout optimization runs the convolutions channels_last: so is the trace
        # (EfficientNet-B0 compiled on the H200: 10.2 ms of GPU work; priced 12.1 so, 19.0 in
        # NCHW with the layout's findings taken off)
        given_ctx = context(traced, model, seen)
        layout = in_mode(run_rules(given_ctx, ["nchw-conv"]), given_ctx, mode)
        layout = [f for f in layout if rules is None or f.rule in rules]
        model, example_inputs = channels_last_as(model, example_inputs)
        with observe(model) as seen, meta_padding_masks(model) as checks:
            traced = trace(model, example_inputs, train=train, device=device, name=name)
        seen.packing_checks = checks.packing
    ctx = context(traced, model, seen)
    report = Report.from_cost(ctx.cost, dtype=dtype_label(dtype or model_dtype(model), flags))
    found = run_rules(ctx, rules)
    if layout is not None:  # the layout as given is judged on the model as given, above
        found = [f for f in found if f.rule != "nchw-conv"]
    elif device in (None, "meta"):  # nchw-conv held to the whole model in channels_last

        def channels_last_ctx() -> AuditContext | None:
            try:
                cl_model, cl_inputs = channels_last_as(model, example_inputs)
                with observe(cl_model) as cl_seen, meta_padding_masks(cl_model) as cl_checks:
                    cl_traced = trace(cl_model, cl_inputs, train=train, device=device, name=name)
            except GpushapeError:
                return None
            cl_seen.packing_checks = cl_checks.packing
            return context(cl_traced, cl_model, cl_seen)

        found = checked_layout(found, ctx, channels_last_ctx, mode)
    report.findings, report.combined = combine(in_mode(found, ctx, mode), ctx)
    report.findings += layout or []  # info: Inductor makes that fix itself
    report.step = step_time(ctx, mode, found)
    report.calibration = target.calibration
    report.gpu_reason = target.reason
    report.inputs = describe_inputs(example_inputs)
    report.with_loss = with_loss
    report.boundary_bytes = traced.boundary_bytes
    return report
