"""Synthetic image folders and a small ImageFolder dataset that decodes to uint8 CHW tensors.

`synthetic_images` writes `root/class_K/img_I.<ext>` (ImageFolder's layout) with content fixed
by the seed: smooth colour fields (a random 7x7 grid, bilinearly upsampled) plus pixel noise, so
JPEG files are photo-sized (~15-25 KB at 224x224) and decoding costs what it costs for real
images. Benchmarks and tests get a real decode path without downloading a dataset.
`ImageFolderDataset` reads such a tree (or any ImageFolder tree) back, decoding with Pillow on
whatever process calls it: in DataLoader workers, that is where the CPU time goes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DataPipelineError, ImageFormatError

FORMATS = {"png": ".png", "jpeg": ".jpg", "pt": ".pt"}
EXTENSIONS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".pt": "pt"}
JPEG_QUALITY = 90
NOISE_STD = 10.0  # pixel noise on top of the smooth field: what makes JPEGs photo-sized
MANIFEST = "synthetic.json"


def synthetic_images(
    root: str | Path,
    n: int,
    size: int | Sequence[int],
    classes: int = 10,
    format: str = "png",
    seed: int = 0,
    workers: int = 1,
) -> Path:
    """Write `n` images of `size` (int or (height, width)) in `classes` folders under `root`.

    Image i belongs to class i % classes; the same seed gives the same files, byte for byte (for
    a given Pillow). A tree already written with the same arguments (its `synthetic.json`
    says so) is kept as it is. `workers` > 1 writes in that many processes. Returns `root`.
    """
    fmt = _check_format(format)
    height, width = _check_size(size)
    for name, value in (("n", n), ("classes", classes), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataPipelineError(f"{name} must be a positive integer, got {value!r}")
    root = Path(root)
    params = {"n": n, "size": [height, width], "classes": classes, "format": fmt, "seed": seed}
    manifest = root / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()) == params:
        return root
    job = _Job(root, (height, width), classes, fmt, seed, len(str(n - 1)), len(str(classes - 1)))
    for k in range(classes):
        (root / job.class_dir(k)).mkdir(parents=True, exist_ok=True)
    chunks = [range(start, min(start + 256, n)) for start in range(0, n, 256)]
    if workers == 1:
        for chunk in chunks:
            job(chunk)
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=_one_thread) as pool:
            list(pool.map(job, chunks))
    manifest.write_text(json.dumps(params))
    return root


def synthetic_pixels(index: int, size: tuple[int, int], classes: int, seed: int) -> np.ndarray:
    """Image `index`'s (H, W, 3) uint8 pixels: a smooth field from a 7x7 grid, tinted by class,
    plus noise; a function of (seed, index) alone."""
    rng = np.random.default_rng([seed, index])
    grid = rng.integers(0, 256, (7, 7, 3)).astype(np.float32)
    tint = np.array([(index % classes) * 97 % 256, 128, 255 - (index % classes) * 53 % 256])
    field = 0.75 * _upsample(grid, size) + 0.25 * tint.astype(np.float32)
    field += NOISE_STD * rng.standard_normal((*size, 3), dtype=np.float32)
    return np.clip(field + 0.5, 0, 255).astype(np.uint8)


def _upsample(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling of an (h, w, 3) grid to (H, W, 3), corners aligned."""
    rows = np.linspace(0, grid.shape[0] - 1, size[0], dtype=np.float32)
    cols = np.linspace(0, grid.shape[1] - 1, size[1], dtype=np.float32)
    r0 = np.minimum(rows.astype(np.int64), grid.shape[0] - 2)
    c0 = np.minimum(cols.astype(np.int64), grid.shape[1] - 2)
    fr = (rows - r0)[:, None, None]
    fc = (cols - c0)[None, :, None]
    top = grid[r0][:, c0] * (1 - fc) + grid[r0][:, c0 + 1] * fc
    bottom = grid[r0 + 1][:, c0] * (1 - fc) + grid[r0 + 1][:, c0 + 1] * fc
    return top * (1 - fr) + bottom * fr


class _Job:
    """Writes a chunk of images; a picklable callable for the process pool."""

    def __init__(self, root, size, classes, fmt, seed, index_width, class_width) -> None:
        self.root, self.size, self.classes, self.fmt, self.seed = root, size, classes, fmt, seed
        self.index_width, self.class_width = index_width, class_width

    def class_dir(self, k: int) -> str:
        return f"class_{k:0{self.class_width}d}"

    def __call__(self, indices: range) -> None:
        for i in indices:
            path = self.root / self.class_dir(i % self.classes)
            path = path / f"img_{i:0{self.index_width}d}{FORMATS[self.fmt]}"
            write_image(path, synthetic_pixels(i, self.size, self.classes, self.seed), self.fmt)


def write_image(path: Path, pixels: np.ndarray, fmt: str) -> None:
    """(H, W, 3) uint8 pixels to `path`: PNG or JPEG by Pillow, or a CHW uint8 tensor (.pt)."""
    if fmt == "pt":
        torch.save(torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), path)
        return
    image = _pil().Image.fromarray(pixels)
    if fmt == "jpeg":
        image.save(path, format="JPEG", quality=JPEG_QUALITY)
    else:
        image.save(path, format="PNG")


def decode_image(path: str | Path) -> torch.Tensor:
    """The image at `path` as a contiguous uint8 (3, H, W) tensor (RGB)."""
    path = Path(path)
    kind = EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ImageFormatError(
            f"cannot read {path.name}: known extensions are {sorted(EXTENSIONS)}"
        )
    if kind == "pt":
        return torch.load(path, weights_only=True)
    with _pil().Image.open(path) as image:
        pixels = np.array(image if image.mode == "RGB" else image.convert("RGB"))
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


class ImageFolderDataset(torch.utils.data.Dataset):
    """`root/<class>/<image>` files as (uint8 (3, H, W) tensor, class index) pairs.

    Classes are the sorted folder names (torchvision's ImageFolder order); files of the known
    extensions (.png, .jpg, .jpeg, .pt) are sorted by path within each. `transform` is applied
    to each decoded tensor on the CPU. Decoding happens in `__getitem__`, so DataLoader workers
    do it in parallel.
    """

    def __init__(self, root: str | Path, transform: Callable[[torch.Tensor], Any] | None = None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataPipelineError(f"no image folder at {self.root}: write one first")
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.class_to_idx = {name: k for k, name in enumerate(self.classes)}
        self.samples = [
            (path, k)
            for k, name in enumerate(self.classes)
            for path in sorted((self.root / name).iterdir())
            if path.suffix.lower() in EXTENSIONS
        ]
        if not self.samples:
            raise DataPipelineError(
                f"{self.root} holds no images in class folders ({', '.join(sorted(EXTENSIONS))})"
            )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        image = decode_image(path)
        return (image if self.transform is None else self.transform(image)), label


def pil_available() -> bool:
    """Whether Pillow imports (PNG and JPEG need it; the 'pt' format does not)."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def _pil() -> Any:
    try:
        import PIL.Image
    except ImportError as error:
        raise ImageFormatError(
            "PNG and JPEG need Pillow: `pip install pillow`, or use format='pt'"
        ) from error
    return PIL


def _check_format(format: str) -> str:
    fmt = {"jpg": "jpeg"}.get(str(format).lower(), str(format).lower())
    if fmt not in FORMATS:
        raise ImageFormatError(f"unknown image format {format!r}; use one of {', '.join(FORMATS)}")
    if fmt != "pt":
        _pil()
    return fmt


def _check_size(size: int | Sequence[int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 2 for v in pair):
        raise DataPipelineError(f"size must be an int or (height, width), each >= 2; got {size!r}")
    return pair  # type: ignore[return-value]


def _one_thread() -> None:
    torch.set_num_threads(1)  # one process per core: no intra-op threads fighting over them
