"""GPU-side image transforms, each one batched op over the whole (N, C, H, W) batch.

Decoding workers should ship uint8 images: a quarter of float32's bytes over PCIe and through
pinned memory. The cast to float (with /255), the resize (one `F.interpolate` call per batch),
the per-channel normalisation and the channels_last layout then run on the GPU, where they cost
microseconds. `GPUTransform` chains them in that order and folds /255 into the normalisation, so
a uint8 batch becomes a normalised bf16 channels_last batch in four kernels at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ._tree import map_tensors
from .errors import DataPipelineError

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # per channel, images in [0, 1]
IMAGENET_STD = (0.229, 0.224, 0.225)
MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


def to_channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor in channels_last layout (same shape, NHWC strides); others unchanged."""
    if tensor.dim() != 4:
        return tensor
    return tensor.contiguous(memory_format=torch.channels_last)


def to_dtype(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Integer images to floating `dtype` in [0, 1] (divided by the type's maximum, 255 for
    uint8); floating images cast only."""
    _check_float_dtype(dtype)
    if images.is_floating_point():
        return images.to(dtype)
    return images.to(dtype) / torch.iinfo(images.dtype).max


def resize(
    images: torch.Tensor, size: int | Sequence[int], mode: str = "bilinear", antialias: bool = False
) -> torch.Tensor:
    """Floating (N, C, H, W) images resized to `size` (an int for square) by one interpolate."""
    _check_images(images)
    linear = mode in ("bilinear", "bicubic")
    return F.interpolate(
        images,
        size=_check_size(size),
        mode=_check_mode(mode),
        align_corners=False if linear else None,
        antialias=antialias and linear,
    )


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(images - mean) / std per channel of floating (N, C, H, W) images."""
    _check_images(images)
    shift, scale = _affine(mean, std, images.shape[1], 1.0, images.device, images.dtype)
    return torch.addcmul(shift, images, scale)


class GPUTransform:
    """Cast, resize, normalise and lay out every 4-D tensor (image batch) of a batch.

    In this order: integer images to float32 (/255 folded into the normalisation), one
    interpolate to `size`, (x - mean) / std per channel, then `dtype` and channels_last in one
    copy. Tensors that are not 4-D (labels, masks of other rank) pass through; for batches with
    other 4-D tensors call `apply` on the images yourself.
    """

    def __init__(
        self,
        *,
        dtype: torch.dtype = torch.float32,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        size: int | Sequence[int] | None = None,
        mode: str = "bilinear",
        antialias: bool = False,
        channels_last: bool = False,
    ) -> None:
        self.dtype = _check_float_dtype(dtype)
        self.mean = None if mean is None else tuple(float(m) for m in mean)
        self.std = None if std is None else tuple(float(s) for s in std)
        if self.std is not None and any(s <= 0 for s in self.std):
            raise DataPipelineError(f"std must be positive per channel, got {self.std}")
        self.size = None if size is None else _check_size(size)
        self.mode = _check_mode(mode)
        self.antialias = bool(antialias)
        self.channels_last = bool(channels_last)
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: Any) -> Any:
        return map_tensors(lambda t: self.apply(t) if t.dim() == 4 else t, batch)

    def __repr__(self) -> str:
        parts = [f"dtype={self.dtype}", f"mean={self.mean}", f"std={self.std}"]
        parts += [f"size={self.size}", f"channels_last={self.channels_last}"]
        return f"GPUTransform({', '.join(parts)})"

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        """The transform of one (N, C, H, W) image batch."""
        _check_images(images, floating=False)
        integer = not images.is_floating_point()
        x = images.to(torch.float32) if integer else images
        if self.size is not None:
            x = resize(x, self.size, self.mode, self.antialias)
        unit = 1.0 / torch.iinfo(images.dtype).max if integer else 1.0
        if self.mean is not None or self.std is not None:
            shift, scale = self._affine_for(x, unit)
            x = torch.addcmul(shift, x, scale)
        elif unit != 1.0:
            x = x * unit
        layout = torch.channels_last if self.channels_last else torch.preserve_format
        return x.to(self.dtype, memory_format=layout)

    def _affine_for(self, x: torch.Tensor, unit: float) -> tuple[torch.Tensor, torch.Tensor]:
        key = (x.device, x.dtype, x.shape[1], unit)
        if key not in self._cache:
            channels = x.shape[1]
            mean = self.mean if self.mean is not None else (0.0,)
            std = self.std if self.std is not None else (1.0,)
            self._cache[key] = _affine(mean, std, channels, unit, x.device, x.dtype)
        return self._cache[key]


def _affine(
    mean: Sequence[float],
    std: Sequence[float],
    channels: int,
    unit: float,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift, scale), each (1, C, 1, 1): x * scale + shift == (unit * x - mean) / std."""
    mean_t = _per_channel(mean, channels, "mean")
    std_t = _per_channel(std, channels, "std")
    scale = unit / std_t
    shift = -mean_t / std_t
    as_4d = dict(device=device, dtype=dtype)
    return shift.view(1, -1, 1, 1).to(**as_4d), scale.view(1, -1, 1, 1).to(**as_4d)


def _per_channel(values: Sequence[float], channels: int, name: str) -> torch.Tensor:
    values = torch.as_tensor(tuple(values), dtype=torch.float64)
    if values.numel() == 1:
        return values.expand(channels)
    if values.numel() != channels:
        raise DataPipelineError(
            f"{name} has {values.numel()} values for images of {channels} channels; "
            f"give one per channel (or one for all)"
        )
    return values


def _check_images(images: Any, floating: bool = True) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise DataPipelineError(f"expected an (N, C, H, W) image batch, got {shape}")
    if floating and not images.is_floating_point():
        raise DataPipelineError(
            f"expected floating images, got {images.dtype}: cast first with to_dtype()"
        )


def _check_size(size: int | Sequence[int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise DataPipelineError(f"size must be an int or (height, width), got {size!r}")
    if min(pair) < 1:
        raise DataPipelineError(f"size must be positive, got {size!r}")
    return pair  # type: ignore[return-value]


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise DataPipelineError(f"resize mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _check_float_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise DataPipelineError(
            f"dtype must be a floating torch.dtype (torch.float32, torch.bfloat16), got {dtype!r}"
        )
    return dtype
