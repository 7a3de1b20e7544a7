"""CUDAPrefetcher on a GPU: values intact after the side-stream hand-off, even when the copy
stream or the consumer stream is slow (a missing wait or record_stream shows up as wrong values)."""

import pytest
import torch

from gpushape.data import CUDAPrefetcher, GPUTransform

pytestmark = pytest.mark.gpu
SLEEP_CYCLES = 20_000_000  # ~10 ms of GPU spin: long enough for a race to show


def source(n=8, shape=(64, 3, 32, 32)):
    gen = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8), "i": i, "y": i}
        for i in range(n)
    ]


def test_same_batches_same_order_values_intact():
    batches = source()
    out = list(CUDAPrefetcher(batches, device="cuda", depth=3))
    assert [b["i"] for b in out] == list(range(8))
    for got, want in zip(out, batches):
        assert got["x"].is_cuda and torch.equal(got["x"].cpu(), want["x"])


def test_consumer_waits_for_a_slow_copy_stream():
    """The transform spins on the side stream first: a consumer that did not wait on the copy's
    event would read the output before it is written."""

    def slow(batch):
        torch.cuda._sleep(SLEEP_CYCLES)
        return {**batch, "x": batch["x"] * 1}

    batches = source()
    for got, want in zip(CUDAPrefetcher(batches, device="cuda", transform=slow), batches):
        assert torch.equal(got["x"].clone().cpu(), want["x"])


def test_memory_is_not_reused_before_the_consumer_reads_it():
    """The consumer queues a spin then a read, and drops the batch at once: without
    record_stream the next copies could land in that memory before the read runs."""
    batches = source(n=16)
    sums = []
    for batch in CUDAPrefetcher(batches, device="cuda", depth=2):
        torch.cuda._sleep(SLEEP_CYCLES)
        sums.append(batch["x"].sum(dtype=torch.int64))
        del batch
    torch.cuda.synchronize()
    assert [int(s) for s in sums] == [int(b["x"].sum(dtype=torch.int64)) for b in batches]


def test_pinned_and_pageable_sources_and_gpu_transform():
    batches = source(n=4)
    batches[1]["x"] = batches[1]["x"].pin_memory()
    transform = GPUTransform(dtype=torch.bfloat16, mean=(0.5,) * 3, std=(0.25,) * 3)
    out = list(CUDAPrefetcher(batches, device="cuda", transform=transform, channels_last=True))
    for got, want in zip(out, batches):
        expected = ((want["x"].float() / 255 - 0.5) / 0.25).to(torch.bfloat16)
        assert got["x"].is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got["x"].cpu(), expected, atol=2e-2, rtol=1e-2)


def test_error_reaches_the_caller_in_order_on_the_gpu():
    def gen():
        yield torch.ones(4)
        yield torch.ones(4) * 2
        raise OSError("disk gone at batch 2")

    got = []
    with pytest.raises(OSError, match="batch 2"):
        for batch in CUDAPrefetcher(gen(), device="cuda", depth=4):
            got.append(batch.sum().item())
    assert got == [4.0, 8.0]


def test_tensors_already_on_the_gpu_pass_through():
    x = torch.arange(10, device="cuda") * 3
    (out,) = list(CUDAPrefetcher([x], device="cuda"))
    assert torch.equal(out, x)


def test_a_dataloader_with_pinned_memory():
    data = torch.utils.data.TensorDataset(torch.arange(64.0).view(16, 4), torch.arange(16))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    prefetcher = CUDAPrefetcher(loader, device="cuda")
    assert len(prefetcher) == 4
    for _ in range(2):  # re-iterable: each pass starts the loader over
        out = torch.cat([x for x, _ in prefetcher])
        assert out.is_cuda and torch.equal(out.cpu(), data.tensors[0])
