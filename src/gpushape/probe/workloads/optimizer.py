"""An optimizer step's multi-tensor kernels on this GPU: what the cost model prices an
optimizer's step at (tracing/optimizer_step.py `step_gpu_s`).

torch.optim's foreach and fused steps run `multi_tensor_apply` kernels, which give every
parameter tensor blocks of its own and split a long list into several launches: a convnet's
many small tensors cost more than their bytes (on an H100 EfficientNet-B0's foreach SGD step,
213 tensors, ran 124 us of kernels for 28 us of bytes). Each implementation is priced as

    time = bytes / (copy rate x efficiency[class]) + tensor_seconds x tensors x kernels

(bytes, tensors and kernels as tracing/optimizer_step.py counts them on a meta copy). The probe
steps SGD with momentum and AdamW, foreach and fused, over two sets of bf16 parameters (a
ResNet-50's 161 tensors, where the time per tensor shows; a few large ones, where the bytes'
rate does), sums each step's kernel time from the profiler, and `fit`s the two numbers: a time
per tensor per implementation, an efficiency per implementation and per class. The profile
keeps them as "optimizer_kernels" (hardware/profile.py). benchmarks/steps/fit_optimizer_kernels.py
fits the same form on the kernels of timed training steps (the H200's and H100's shipped
figures). The first set was 256 tensors of 4,096 numbers: on an H100 they cost 0.02 us a tensor
a kernel beyond their bytes where the training steps' tensors cost 0.13-0.23
(benchmarks/results/kernels-h100/probe_optimizer_kernels.json), so the probe now times a real
model's shapes, one of the models the training steps' fit saw (its foreach SGD step ran 221 us
of kernels there).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..memory import capped

MODEL = "resnet50"  # the zoo model whose parameter shapes make the first set
LARGE = (16, 1 << 21)  # the second set: (tensors, numbers)


def parameter_sets(scale: float = 1.0) -> dict[str, list[int]]:
    """{set name: each tensor's numbers}; below `scale` 0.05 (a smoke test) 64 numbers each."""
    from ...models import create_model

    model, _ = create_model(MODEL, batch=1)
    shapes = [p.numel() for p in model.parameters()]
    sets = {f"{MODEL}'s parameters": shapes, "large tensors": [LARGE[1]] * LARGE[0]}
    if scale < 0.05:
        sets = {name: [64] * len(sizes) for name, sizes in sets.items()}
    return sets


CLASSES = {
    "SGD": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    "AdamW": (torch.optim.AdamW, {"lr": 1e-4}),
}
MIN_ROWS = 3  # an implementation timed fewer times takes the other's time per tensor


def fit(rows: list[dict], bandwidth: float) -> dict[str, dict]:
    """{"foreach": row, "foreach/SGD": row, ...} from timed steps, each {impl, class, bytes,
    tensors, kernels, measured_s} (and "model", named in the rows' evidence): per implementation
    a time per tensor per kernel and an efficiency, least squares on relative error; per class
    the efficiency with that time per tensor."""
    out: dict[str, dict] = {}
    fitted_c: dict[str, float] = {}
    impls = sorted({r["impl"] for r in rows}, key=lambda i: -sum(r["impl"] == i for r in rows))
    for impl in impls:
        used = [r for r in rows if r["impl"] == impl]
        classes = sorted({r["class"] for r in used})
        y = np.array([r["measured_s"] for r in used])
        bytes_s = np.array([r["bytes"] / bandwidth for r in used])
        tk = np.array([r["tensors"] * r["kernels"] for r in used], dtype=float)
        borrowed = len(used) < MIN_ROWS and bool(fitted_c)
        if borrowed:
            c = next(iter(fitted_c.values()))
        else:
            cols = [bytes_s * np.array([r["class"] == k for r in used]) for k in classes]
            x = np.column_stack([*cols, tk]) / y[:, None]
            c = max(float(np.linalg.lstsq(x, np.ones_like(y), rcond=None)[0][-1]), 0.0)
        fitted_c[impl] = c
        rest = np.maximum(y - c * tk, 1e-9)
        for k in [None, *classes]:
            pick = [i for i, r in enumerate(used) if k is None or r["class"] == k]
            name = impl if k is None else f"{impl}/{k}"
            out[name] = {
                "efficiency": capped(float(np.sum(bytes_s[pick])), float(np.sum(rest[pick]))),
                **({"tensor_seconds": c} if k is None else {}),
                "models": sorted({str(used[i].get("model", "")) for i in pick}),
                "tensor_seconds_from": "the other implementation's fit" if borrowed else "this fit",
            }  # fmt: skip
    return out


def predicted_s(row: dict, fitted: dict, bandwidth: float) -> float:
    """A timed step's time as `fit`'s rows price it: the cost model's own pricing
    (`tracing.optimizer_step.kernels_priced_s`) on the rows as a profile holds them."""
    from ...hardware.profile import optimizer_kernel_rates
    from ...tracing.optimizer_step import StepCost, kernels_priced_s

    step = StepCost(row["impl"], row["kernels"], row["bytes"], row["tensors"])
    return kernels_priced_s(step, row["class"], optimizer_kernel_rates(fitted), bandwidth)


def kernels_s(optimizer: torch.optim.Optimizer, device: str, steps: int = 10) -> float:
    """Seconds of one step's kernels on the GPU (the profiler's device time, summed); on the
    CPU the step's own time (a smoke test)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # the state, and the kernels' first calls
        optimizer.step()
    if torch.device(device).type != "cuda":
        t0 = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        return (time.perf_counter() - t0) / steps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            optimizer.step()
        torch.cuda.synchronize()
    device_us = sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA")
    return device_us * 1e-6 / steps


def measure_optimizer_kernels(
    spec: Any,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    scale: float = 1.0,
    steps: int = 10,
) -> dict[str, Any]:
    """The "optimizer_kernels" rows (module docstring) and the timed steps under "steps"; a
    class or implementation this device lacks is left out ("errors")."""
    from ...tracing.optimizer_step import current_step

    rows, errors = [], {}
    for set_name, sizes in parameter_sets(scale).items():
        params = [torch.zeros(n, device=device, dtype=dtype, requires_grad=True) for n in sizes]
        for p in params:
            p.grad = torch.zeros_like(p)
        for name, (cls, options) in CLASSES.items():
            for impl in ("foreach", "fused"):
                try:
                    optimizer = cls(params, **options, **{impl: True})
                    measured = kernels_s(optimizer, device, steps)
                except (RuntimeError, TypeError) as exc:  # an implementation not here
                    errors[f"{impl}/{name}"] = f"{type(exc).__name__}: {exc}"[:200]
                    continue
                counted = current_step(optimizer)
                label = f"{len(sizes)} tensors, {set_name}"
                rows.append({"model": label, "class": name, "impl": impl,
                             "bytes": counted.bytes_moved, "tensors": counted.parameters,
                             "kernels": counted.kernels, "measured_s": measured})  # fmt: skip
    out: dict[str, Any] = fit(rows, spec.attainable_bandwidth_bytes_per_s()) if rows else {}
    for row in out.values():
        row["workload"] = "SGD (momentum) and AdamW steps, foreach and fused, bf16"
    return {"rows": out, "steps": rows, "errors": errors}
