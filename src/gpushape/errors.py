"""Errors gpushape raises on purpose. The CLI turns a `GpushapeError` into one line and exit 2."""

from __future__ import annotations


class GpushapeError(Exception):
    """Bad usage or bad input: the message says what was wrong and what to do."""


class UnknownGPUError(GpushapeError, LookupError):
    """A GPU name that is not in the catalog."""


class ProfileError(GpushapeError, ValueError):
    """A calibrated profile that cannot be read or does not fit the catalog."""


class NoCudaError(GpushapeError, RuntimeError):
    """The command measures a GPU, and this machine has no CUDA device."""


def meta_only(exc: BaseException) -> bool:
    """Whether `exc` is the meta device's own failure (an op without a meta kernel, a value
    read from a tensor that has none), which real tensors would not meet; PyTorch's meta
    kernels say so in these words, where an op's check of its shapes fails alike anywhere."""
    return isinstance(exc, NotImplementedError) or "meta" in str(exc).lower()
