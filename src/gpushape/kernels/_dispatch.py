"""Shared checks and the Triton-or-reference decision for every kernel in this package.

CUDA tensors run the Triton kernels. CPU tensors run the plain-PyTorch reference, except when
`TRITON_INTERPRET=1` is set: then they run the Triton kernels in Triton's interpreter, which is
how CI tests the kernels themselves on a machine without a GPU.
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def eager_path(x: torch.Tensor) -> bool:
    """Plain tensors outside torch.compile skip the custom ops (or plain-PyTorch glue) for an
    eager autograd.Function: the custom ops' Python dispatch (schema, fake and autograd layers)
    costs more host time than these kernels take on the GPU. Subclasses (fake tensors,
    DTensor, ...), meta tensors (gpushape's trace: one recorded op a pass, priced as the
    kernel) and compilation keep the registered custom ops."""
    return type(x) is torch.Tensor and not x.is_meta and not torch.compiler.is_compiling()


def functorch_active() -> bool:
    """torch.func transforms (grad, vmap, jacrev, ...) are running. gpushape's eager
    autograd.Functions and custom ops do not support them, so the ops then take their
    plain-PyTorch reference, which the transforms differentiate (and batch) like any code."""
    return torch._C._are_functorch_transforms_active()


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """True when these (same-device) tensors should run the Triton kernels."""
    device = next(t.device for t in tensors if t is not None)
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreting() and triton_available()


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    given = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in given.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{name} on {t.device}" for name, t in given.items())
        raise RuntimeError(f"{op}: all tensors must be on one device, got {listing}")


def check_float(op: str, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{op}: {name} must be float32, float16 or bfloat16 (float64 on CPU), got {t.dtype}"
            )
