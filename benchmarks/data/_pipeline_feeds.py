"""What feeds bench_input_pipeline.py's training step: the image files and the pre-decoded shard
it writes (`prepare_data`), and the batches of each variant: synthetic (one batch already on the
device), recommended (recommend_loader's DataLoader through the CUDAPrefetcher) and naive (no
workers, no pinning, CPU normalisation, blocking copies)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, RandomSampler

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.data import (  # noqa: E402
    IMAGENET_MEAN,
    IMAGENET_STD,
    CUDAPrefetcher,
    GPUTransform,
    ImageFolderDataset,
    TensorShardDataset,
    cores_available,
    pil_available,
    recommend_loader,
    synthetic_images,
    write_shard,
)


def sampler(dataset, args) -> RandomSampler:
    """Random order over the files, one epoch long enough for the whole run (no epoch seams)."""
    gen = torch.Generator().manual_seed(0)
    return RandomSampler(
        dataset, num_samples=(args.warmup + args.steps) * args.batch, generator=gen
    )


def gpu_transform(device: torch.device) -> GPUTransform:
    """uint8 -> normalised channels_last; bf16 on CUDA (autocast's dtype), float32 on the CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return GPUTransform(dtype=dtype, mean=IMAGENET_MEAN, std=IMAGENET_STD, channels_last=True)


def synthetic_batches(args, device: torch.device, classes: int):
    """The same normalised bf16 channels_last batch, already on the device, every step."""
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, 3, args.image_size, args.image_size)
    x = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(device)
    y = torch.randint(0, classes, (args.batch,), generator=gen).to(device)
    x = gpu_transform(device)(x)
    while True:
        yield x, y


def recommended_batches(dataset, args, device: torch.device, target_s: float | None):
    """recommend_loader's DataLoader over `dataset`, through the prefetcher with GPU transforms."""
    advice = recommend_loader(dataset, args.batch, target_step_s=target_s, sample_batches=4)
    loader = DataLoader(
        dataset, sampler=sampler(dataset, args), drop_last=True, **advice.loader_kwargs()
    )
    prefetcher = CUDAPrefetcher(loader, device, transform=gpu_transform(device))
    return prefetcher, advice


def naive_batches(dataset, args, device: torch.device):
    """No workers, no pinning, float32 normalisation on the CPU, blocking copies."""
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        sampler=sampler(dataset, args),
        drop_last=True,
        num_workers=0,
        pin_memory=False,
    )
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    for x, y in loader:
        x = (x.float() / 255 - mean) / std
        yield x.to(device), y.to(device)


def prepare_data(args, root: Path) -> tuple[ImageFolderDataset, TensorShardDataset, dict]:
    """The image files (JPEG; per-image .pt when Pillow is missing) and the pre-decoded shard."""
    fmt = "jpeg" if pil_available() else "pt"
    t0 = time.perf_counter()
    images = synthetic_images(
        root / fmt,
        args.images,
        args.image_size,
        classes=args.classes,
        format=fmt,
        workers=max(cores_available(), 1),
    )
    t1 = time.perf_counter()
    files = ImageFolderDataset(images)
    shard_path = root / f"shard-{args.shard_images}-{args.image_size}.pt"
    if not shard_path.exists():
        write_shard(
            files,
            shard_path,
            n=min(args.shard_images, len(files)),
            workers=max(cores_available() - 1, 0),
            batch=64,
        )
    t2 = time.perf_counter()
    nbytes = sum(p.stat().st_size for p in Path(images).rglob("*") if p.is_file())
    setup = {
        "image_format": fmt,
        "images": len(files),
        "image_bytes_mean": nbytes / max(len(files), 1),
        "write_images_s": t1 - t0,
        "write_shard_s": t2 - t1,
        "shard_images": args.shard_images,
        "data_dir": str(root),
    }
    if fmt != "jpeg":
        print("note: Pillow is missing; per-image .pt files stand in for JPEGs (no decode)")
    return files, TensorShardDataset(shard_path), setup
