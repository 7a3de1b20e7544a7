"""The input pipeline: keeping the GPU fed.

- `CUDAPrefetcher`: batches copied to the GPU on a side stream, `depth` ahead (prefetch.py).
- `GPUTransform` and `to_dtype` / `resize` / `normalize` / `to_channels_last`: batched image
  transforms on the GPU (gpu_transforms.py).
- `recommend_loader` -> `LoaderAdvice`: DataLoader settings from a measured load time
  (loader_advice.py).
- `synthetic_images`, `ImageFolderDataset`: image folders without a download (images.py);
  `write_shard`, `TensorShardDataset`: pre-decoded uint8 shards (shards.py).
"""

from .errors import DataPipelineError, ImageFormatError, NotIterableError
from .gpu_transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    GPUTransform,
    normalize,
    resize,
    to_channels_last,
    to_dtype,
)
from .images import ImageFolderDataset, decode_image, pil_available, synthetic_images
from .loader_advice import LoaderAdvice, advice_for_loader, cores_available, recommend_loader
from .prefetch import CUDAPrefetcher
from .shards import TensorShardDataset, write_shard

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CUDAPrefetcher",
    "DataPipelineError",
    "GPUTransform",
    "ImageFolderDataset",
    "ImageFormatError",
    "LoaderAdvice",
    "NotIterableError",
    "TensorShardDataset",
    "advice_for_loader",
    "cores_available",
    "decode_image",
    "normalize",
    "pil_available",
    "recommend_loader",
    "resize",
    "synthetic_images",
    "to_channels_last",
    "to_dtype",
    "write_shard",
]
