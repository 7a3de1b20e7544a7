"""The report's header, in plain text: what was audited, on which chip and why that chip.

    resnet50, batch 64, 3x224x224 images, bf16, training step, on NVIDIA H200 SXM 141GB
    (h200-sxm, the GPU present)
    21.480 ms predicted; calibrated by measurement: bundled profile h200-sxm.json

Every format prints it (`render.headline`): the terminal (escaped for rich there), Markdown
and HTML. The input description comes from the example inputs (`describe_inputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..modes import predicted_step_s

SHAPES_LISTED = 3  # input shapes spelled out when they are not images or tokens


def describe_inputs(example_inputs: Any) -> str | None:
    """The example inputs in words, from the first one's shape: (B, C, H, W) floats are
    "batch B, CxHxW images", (B, T) integers "batch B, sequence T"; others their shapes."""
    shaped = [v for v in _values(example_inputs) if _shape(v) is not None]
    if not shaped:
        return None
    shape, dtype = _shape(shaped[0]), getattr(shaped[0], "dtype", None)
    floating = bool(getattr(dtype, "is_floating_point", False))
    if len(shape) == 4 and floating:
        return f"batch {shape[0]}, {_dims(shape[1:])} images"
    if len(shape) == 2 and not floating and str(dtype) != "torch.bool":
        return f"batch {shape[0]}, sequence {shape[1]}"
    listed = ", ".join(_dims(_shape(v)) for v in shaped[:SHAPES_LISTED])
    more = f" +{len(shaped) - SHAPES_LISTED} more" if len(shaped) > SHAPES_LISTED else ""
    return f"input{'s' if len(shaped) > 1 else ''} {listed}{more}"


def header_lines(report: Any) -> list[str]:
    """Two lines: model, inputs, dtype, step, the chip and why it was chosen; then the
    predicted time and where the chip's numbers came from."""
    step = "training step" if report.train else "forward"
    if report.train and report.with_loss:
        step += " with the model's own loss"
    what = [report.model, getattr(report, "inputs", None), report.dtype, step]
    reason = getattr(report, "gpu_reason", None)
    chip = f"{report.gpu}, {reason}" if reason else report.gpu
    numbers = (
        f"calibrated by measurement: {report.calibration}"
        if report.calibration
        else "datasheet numbers"
    )
    return [
        f"{', '.join(w for w in what if w)}, on {report.gpu_full_name} ({chip})",
        f"{predicted_step_s(report) * 1e3:,.3f} ms predicted{_step(report)}; {numbers}",
    ]


def _step(report: Any) -> str:
    """' (eager: host-bound, ...)' where the audit knows its mode. Where the step is priced as
    its kernels and launches in series (eager on a profile that has not measured how the GPU
    idles between kernels: `predicted_step_s`), says so rather than which side binds, which
    would contradict the sum printed before it."""
    step = getattr(report, "step", None)
    if step is None:
        return ""
    totals = report.totals
    if step.mode == "eager" and not step.idle_s and predicted_step_s(report) > step.wall_s:
        return (
            f" (eager: {totals.kernel_time_s * 1e3:,.3f} ms of kernels + "
            f"{totals.launch_s * 1e3:,.3f} ms of launches, not overlapped)"
        )
    return f" ({step.text()})"


def header_text(report: Any) -> str:
    return "\n".join(header_lines(report))


def _values(example_inputs: Any) -> list[Any]:
    if isinstance(example_inputs, Mapping):
        return list(example_inputs.values())
    if isinstance(example_inputs, (tuple, list)):
        return list(example_inputs)
    return [example_inputs]


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    try:
        return None if shape is None else tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        return None


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape) if shape else "scalar"
