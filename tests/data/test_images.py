"""synthetic_images is reproducible and ImageFolderDataset reads it back; shards round-trip."""

import hashlib
from pathlib import Path

import pytest
import torch

from gpushape.data import (
    DataPipelineError,
    ImageFolderDataset,
    ImageFormatError,
    TensorShardDataset,
    pil_available,
    synthetic_images,
    write_shard,
)

FORMATS = [
    "pt",
    pytest.param("png", marks=pytest.mark.skipif(not pil_available(), reason="needs Pillow")),
    pytest.param("jpeg", marks=pytest.mark.skipif(not pil_available(), reason="needs Pillow")),
]


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_seed_same_bytes(tmp_path, fmt):
    a = synthetic_images(tmp_path / "a", 12, (16, 20), classes=3, format=fmt, seed=7)
    b = synthetic_images(tmp_path / "b", 12, (16, 20), classes=3, format=fmt, seed=7)
    c = synthetic_images(tmp_path / "c", 12, (16, 20), classes=3, format=fmt, seed=8)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)
    assert len(digest(a)) == 12 + 1  # the images and synthetic.json


@pytest.mark.parametrize("fmt", FORMATS)
def test_dataset_reads_the_tree_back(tmp_path, fmt):
    root = synthetic_images(tmp_path, 10, (16, 20), classes=4, format=fmt, seed=0)
    data = ImageFolderDataset(root)
    assert len(data) == 10 and data.classes == ["class_0", "class_1", "class_2", "class_3"]
    labels = sorted(label for _, label in (data[i] for i in range(10)))
    assert labels == sorted(i % 4 for i in range(10))
    image, _ = data[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 16, 20) and image.is_contiguous()


def test_lossless_formats_decode_to_the_same_pixels(tmp_path):
    if not pil_available():
        pytest.skip("needs Pillow")
    pt = ImageFolderDataset(synthetic_images(tmp_path / "pt", 6, 12, classes=2, format="pt"))
    png = ImageFolderDataset(synthetic_images(tmp_path / "png", 6, 12, classes=2, format="png"))
    for i in range(6):
        assert torch.equal(pt[i][0], png[i][0]) and pt[i][1] == png[i][1]


def test_existing_tree_is_kept_and_workers_write_the_same(tmp_path):
    root = synthetic_images(tmp_path / "one", 20, 8, classes=2, format="pt", seed=3)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.pt")}
    synthetic_images(root, 20, 8, classes=2, format="pt", seed=3)
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.pt")} == before
    parallel = synthetic_images(tmp_path / "two", 20, 8, classes=2, format="pt", seed=3, workers=2)
    assert digest(parallel) == digest(root)


def test_shard_round_trip_through_workers(tmp_path):
    data = ImageFolderDataset(synthetic_images(tmp_path / "img", 9, 8, classes=3, format="pt"))
    path = write_shard(data, tmp_path / "shard.pt", n=7, batch=4)
    shard = TensorShardDataset(path)
    assert len(shard) == 7
    loader = torch.utils.data.DataLoader(shard, batch_size=4, num_workers=1)
    images = torch.cat([x for x, _ in loader])
    assert torch.equal(images, torch.stack([data[i][0] for i in range(7)]))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"format": "gif"}, ImageFormatError),
        ({"n": 0}, DataPipelineError),
        ({"size": 1}, DataPipelineError),
        ({"classes": -1}, DataPipelineError),
    ],
)
def test_bad_arguments(tmp_path, kwargs, error):
    args = {"n": 4, "size": 8, "format": "pt", **kwargs}
    with pytest.raises(error):
        synthetic_images(tmp_path, **args)


def test_missing_or_empty_folders(tmp_path):
    with pytest.raises(DataPipelineError, match="no image folder"):
        ImageFolderDataset(tmp_path / "absent")
    (tmp_path / "empty" / "class_0").mkdir(parents=True)
    with pytest.raises(DataPipelineError, match="no images"):
        ImageFolderDataset(tmp_path / "empty")
    with pytest.raises(DataPipelineError, match="no shard"):
        TensorShardDataset(tmp_path / "nothing.pt")


def test_png_without_pillow_says_what_to_do(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name.startswith("PIL"):
            raise ImportError("no PIL here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(ImageFormatError, match="format='pt'"):
        synthetic_images(tmp_path, 4, 8, format="png")
