"""Pre-decoded image shards: N uint8 images in one file, for when JPEG decoding cannot keep up.

`write_shard` decodes a dataset once (through DataLoader workers) and saves `{"images": (N, C,
H, W) uint8, "labels": (N,) int64}` with `torch.save`. `TensorShardDataset` memory-maps it in
each process that reads it (the file is never pickled to workers), so a sample is a slice of the
page cache and a batch costs one memcpy in collate: no decode at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from .errors import DataPipelineError


def write_shard(
    dataset: Dataset, path: str | Path, n: int | None = None, workers: int = 0, batch: int = 256
) -> Path:
    """Decode the first `n` samples (all when None) of `dataset`, (uint8 image, label) pairs,
    into one shard file at `path`; `workers` DataLoader processes decode in parallel."""
    total = len(dataset)  # type: ignore[arg-type]
    n = total if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise DataPipelineError(f"n must be an integer in 1..{total} (the dataset's size), got {n}")
    loader = DataLoader(Subset(dataset, range(n)), batch_size=batch, num_workers=workers)
    images, labels = [], []
    for image, label in loader:
        if image.dtype != torch.uint8:
            raise DataPipelineError(f"a shard holds uint8 images; the dataset gives {image.dtype}")
        images.append(image)
        labels.append(torch.as_tensor(label, dtype=torch.int64))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"images": torch.cat(images), "labels": torch.cat(labels)}, path)
    return path


class TensorShardDataset(Dataset):
    """(uint8 image, label) pairs from a `write_shard` file, memory-mapped on first use."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataPipelineError(f"no shard at {self.path}: write one with write_shard")
        self._data: dict[str, torch.Tensor] | None = None

    def _open(self) -> dict[str, torch.Tensor]:
        if self._data is None:
            data = torch.load(self.path, mmap=True, weights_only=True)
            if not isinstance(data, dict) or {"images", "labels"} - data.keys():
                raise DataPipelineError(f"{self.path} is not a shard (images and labels)")
            self._data = data
        return self._data

    def __len__(self) -> int:
        return len(self._open()["labels"])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = self._open()
        return data["images"][index], data["labels"][index]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_data": None}  # each worker maps the file itself
