"""GPUTransform and the functional transforms against the plain torch composition."""

import pytest
import torch
import torch.nn.functional as F

from gpushape.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DataPipelineError,
    GPUTransform,
    normalize,
    resize,
    to_channels_last,
    to_dtype,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def images(device, dtype=torch.uint8, shape=(4, 3, 20, 24)):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, shape, generator=gen, dtype=dtype).to(device)


def plain(x, mean, std, size, dtype, channels_last):
    """The textbook composition, one op at a time."""
    y = x.float() / 255
    if size is not None:
        y = F.interpolate(y, size=size, mode="bilinear", align_corners=False)
    mean_t = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    y = ((y - mean_t) / std_t).to(dtype)
    return y.contiguous(memory_format=torch.channels_last) if channels_last else y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [None, (16, 16), (40, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_transform_matches_the_plain_composition(device, size, dtype, channels_last):
    x = images(device)
    transform = GPUTransform(
        dtype=dtype, mean=IMAGENET_MEAN, std=IMAGENET_STD, size=size, channels_last=channels_last
    )
    got = transform(x)
    want = plain(x, IMAGENET_MEAN, IMAGENET_STD, size, dtype, channels_last)
    assert got.dtype == dtype and got.shape == want.shape and got.device == x.device
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1e-2}
    torch.testing.assert_close(got, want, **tol)


def test_one_interpolate_call_per_batch(monkeypatch):
    calls = []
    original = F.interpolate
    monkeypatch.setattr(F, "interpolate", lambda *a, **k: calls.append(1) or original(*a, **k))
    GPUTransform(size=8, mean=(0.5,), std=(0.5,))(images("cpu", shape=(16, 3, 10, 10)))
    assert len(calls) == 1


def test_transform_touches_only_image_batches_in_a_structure():
    x, labels = images("cpu"), torch.arange(4)
    out = GPUTransform(dtype=torch.float32)({"img": x, "label": labels, "name": "n"})
    assert out["label"] is labels and out["name"] == "n"
    torch.testing.assert_close(out["img"], x.float() / 255)


def test_functional_forms():
    x = images("cpu")
    y = to_dtype(x, torch.float32)
    torch.testing.assert_close(y, x.float() / 255)
    assert to_dtype(y, torch.bfloat16).dtype == torch.bfloat16
    torch.testing.assert_close(
        resize(y, 10), F.interpolate(y, size=(10, 10), mode="bilinear", align_corners=False)
    )
    torch.testing.assert_close(
        normalize(y, (0.1, 0.2, 0.3), (0.5, 0.5, 2.0)),
        (y - torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1))
        / torch.tensor([0.5, 0.5, 2.0]).view(1, 3, 1, 1),
    )
    cl = to_channels_last(y)
    assert cl.is_contiguous(memory_format=torch.channels_last) and torch.equal(cl, y)
    labels = torch.arange(3)
    assert to_channels_last(labels) is labels


def test_float_input_is_not_rescaled():
    y = torch.rand(2, 3, 4, 4)
    torch.testing.assert_close(GPUTransform(mean=(0.5,), std=(2.0,))(y), (y - 0.5) / 2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": torch.int32},
        {"std": (1.0, 0.0, 1.0)},
        {"size": 0},
        {"size": (1, 2, 3)},
        {"mode": "lanczos"},
    ],
)
def test_bad_transform_arguments(kwargs):
    with pytest.raises(DataPipelineError):
        GPUTransform(**kwargs)


def test_bad_images():
    with pytest.raises(DataPipelineError, match="one per channel"):
        GPUTransform(mean=(0.1, 0.2), std=(1.0, 1.0))(images("cpu"))
    with pytest.raises(DataPipelineError, match=r"\(N, C, H, W\)"):
        GPUTransform().apply(torch.zeros(3, 4, 4))
    with pytest.raises(DataPipelineError, match="to_dtype"):
        resize(images("cpu"), 8)
