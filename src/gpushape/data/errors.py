"""The input pipeline's errors: each one line that says what to change."""

from __future__ import annotations

from ..errors import GpushapeError


class DataPipelineError(GpushapeError, ValueError):
    """A bad argument to the input pipeline (depth, device, batch size, sizes, counts)."""


class NotIterableError(DataPipelineError, TypeError):
    """The prefetcher was given something it cannot iterate over."""


class ImageFormatError(DataPipelineError):
    """An image format gpushape cannot write or read, or the library it needs is missing."""
