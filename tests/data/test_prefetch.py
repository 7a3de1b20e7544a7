"""CUDAPrefetcher on the CPU lane: the pass-through, errors, len/re-iteration, and the queue
logic of the CUDA path driven with stand-in streams and events (no GPU needed)."""

import contextlib
from collections import OrderedDict, namedtuple

import pytest
import torch

from gpushape.data import CUDAPrefetcher, DataPipelineError, GPUTransform, NotIterableError
from gpushape.errors import GpushapeError

Pair = namedtuple("Pair", "x y")


def batches(n=5):
    return [(torch.full((2, 3), float(i)), torch.tensor([i])) for i in range(n)]


def failing(k, error=ValueError):
    """Yields batches 0..k-1, then raises at batch k."""
    for i in range(k):
        yield torch.full((2,), float(i))
    raise error(f"bad batch {k}")


def test_cpu_pass_through_yields_the_same_objects_in_order():
    """Pass-through contract: without transform or channels_last, the source's own objects."""
    source = batches()
    out = list(CUDAPrefetcher(source, device="cpu"))
    assert len(out) == len(source)
    assert all(a is b for a, b in zip(out, source))


def test_no_cuda_means_pass_through():
    prefetcher = CUDAPrefetcher(batches(), device="cuda")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU tests cover the copy")
    assert not prefetcher.active and prefetcher.device == torch.device("cpu")
    assert [b[1].item() for b in prefetcher] == list(range(5))


def test_nested_structures_keep_their_shape_and_non_tensor_leaves():
    batch = {
        "pair": (torch.ones(2), torch.zeros(1)),
        "named": Pair(torch.arange(3), "label"),
        "meta": OrderedDict(name="a.jpg", size=3),
        "list": [torch.eye(2), None, 7],
    }
    (out,) = list(CUDAPrefetcher([batch], device="cpu", transform=lambda b: b))
    assert out is batch
    (out,) = list(CUDAPrefetcher([batch], device="cpu", channels_last=True))
    assert isinstance(out["named"], Pair) and out["named"].y == "label"
    assert isinstance(out["meta"], OrderedDict) and out["meta"]["name"] == "a.jpg"
    assert out["list"][1] is None and out["list"][2] == 7
    assert torch.equal(out["pair"][0], batch["pair"][0])


def test_transform_applies_on_the_cpu_lane():
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    transform = GPUTransform(dtype=torch.float32)
    (out,) = list(CUDAPrefetcher([(images, "x")], device="cpu", transform=transform))
    torch.testing.assert_close(out[0], images.float() / 255)
    assert out[1] == "x"


@pytest.mark.parametrize("k", [0, 1, 3])
def test_source_error_arrives_after_the_batches_before_it(k):
    got = []
    with pytest.raises(ValueError, match=f"bad batch {k}"):
        for batch in CUDAPrefetcher(failing(k), device="cpu"):
            got.append(int(batch[0]))
    assert got == list(range(k))


def test_len_and_reiteration_follow_the_source():
    source = batches(4)
    prefetcher = CUDAPrefetcher(source, device="cpu")
    assert len(prefetcher) == 4
    assert [b[1].item() for b in prefetcher] == [b[1].item() for b in prefetcher] == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        len(CUDAPrefetcher(iter(source), device="cpu"))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"depth": 0}, DataPipelineError),
        ({"depth": 1.5}, DataPipelineError),
        ({"depth": True}, DataPipelineError),
        ({"device": "meta"}, DataPipelineError),
        ({"device": "not-a-device"}, DataPipelineError),
        ({"transform": 3}, DataPipelineError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error) as info:
        CUDAPrefetcher(batches(), **kwargs)
    assert isinstance(info.value, GpushapeError) and "\n" not in str(info.value)


def test_non_iterable_is_refused():
    with pytest.raises(NotIterableError, match="iterable"):
        CUDAPrefetcher(42)


class FakeEvent:
    def __init__(self):
        self.recorded_on = None

    def record(self, stream):
        self.recorded_on = stream


class FakeStream:
    def __init__(self, device=None):
        self.waited_events, self.waited_streams = [], []

    def wait_event(self, event):
        self.waited_events.append(event)

    def wait_stream(self, stream):
        self.waited_streams.append(stream)


@pytest.fixture
def fake_cuda(monkeypatch):
    """The CUDA path with stand-in streams: copies are clones, record_stream is logged."""
    consumer = FakeStream()
    recorded = []
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(CUDAPrefetcher, "active", property(lambda self: True))
    monkeypatch.setattr(CUDAPrefetcher, "_copy", lambda self, t: t.clone())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: recorded.append((t, s)))
    return consumer, recorded


def counting(n, pulled):
    for i in range(n):
        pulled.append(i)
        yield {"x": torch.full((2,), float(i)), "name": f"b{i}"}


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_cuda_path_keeps_depth_ahead_and_waits_before_hand_out(fake_cuda, depth):
    consumer, recorded = fake_cuda
    pulled = []
    prefetcher = CUDAPrefetcher(counting(6, pulled), device="cpu", depth=depth)
    for k, batch in enumerate(prefetcher):
        assert len(pulled) == min(k + 1 + depth, 6)  # batch k out, `depth` more in flight
        assert batch["name"] == f"b{k}" and torch.equal(batch["x"], torch.full((2,), float(k)))
        event = consumer.waited_events[-1]
        assert len(consumer.waited_events) == k + 1 and isinstance(event.recorded_on, FakeStream)
        assert recorded[-1] == (batch["x"], consumer)
    assert len(recorded) == 6


def test_cuda_path_error_arrives_in_order(fake_cuda):
    got = []
    with pytest.raises(KeyError):
        for batch in CUDAPrefetcher(failing(3, KeyError), device="cpu", depth=4):
            got.append(int(batch[0]))
    assert got == [0, 1, 2]


def test_cuda_path_copy_error_arrives_in_order(fake_cuda, monkeypatch):
    def transform(batch):
        if int(batch[0]) == 2:
            raise RuntimeError("transform failed on batch 2")
        return batch

    got = []
    with pytest.raises(RuntimeError, match="batch 2"):
        for batch in CUDAPrefetcher(failing(5), device="cpu", transform=transform):
            got.append(int(batch[0]))
    assert got == [0, 1]


def test_cuda_path_waits_for_tensors_already_on_the_gpu(fake_cuda, monkeypatch):
    consumer, _ = fake_cuda
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    prefetcher = CUDAPrefetcher([torch.ones(2)], device="cpu")
    list(prefetcher)
    assert prefetcher._stream.waited_streams == [consumer]
