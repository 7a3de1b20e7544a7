"""recommend_loader: sane advice on a small dataset, DataLoader accepts its kwargs."""

import dataclasses
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gpushape.data import (
    DataPipelineError,
    LoaderAdvice,
    advice_for_loader,
    cores_available,
    recommend_loader,
)
from gpushape.data import loader_advice as la


class SlowDataset(Dataset):
    """Each sample takes `delay_s` to load."""

    def __init__(self, n=64, delay_s=0.002):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return torch.full((3, 4, 4), i, dtype=torch.uint8), i


def test_advice_is_sane_and_dataloader_accepts_it():
    data = SlowDataset()
    advice = recommend_loader(data, 8, sample_batches=3)
    assert isinstance(advice, LoaderAdvice) and advice.cores == cores_available()
    assert advice.num_workers == max(advice.cores - 1, 0)
    assert advice.pin_memory == torch.cuda.is_available()
    assert advice.persistent_workers == (advice.num_workers > 0)
    assert advice.load_s_per_batch >= 8 * 0.002 and len(advice.sample_times_s) == 3
    assert advice.batch_bytes == 8 * 48 + 8 * 8
    assert advice.reasoning and all(isinstance(r, str) and "\n" not in r for r in advice.reasoning)
    kwargs = advice.loader_kwargs()
    if advice.num_workers:
        assert 2 <= kwargs["prefetch_factor"] <= 4
    else:
        assert "prefetch_factor" not in kwargs
    loader = DataLoader(data, **kwargs)
    assert sum(len(y) for _, y in loader) == 64


def test_frozen_keyword_only():
    advice = recommend_loader(SlowDataset(), 4, sample_batches=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        advice.num_workers = 3
    with pytest.raises(TypeError):
        LoaderAdvice(4, 1)


@pytest.mark.parametrize("cores, expected", [(16, 3), (3, 2), (1, 0)])
def test_workers_from_target_step_and_cores(monkeypatch, cores, expected):
    """load 20 ms x 1.25 headroom / w < 10 ms needs w = 3, capped at cores - 1."""
    monkeypatch.setattr(la, "cores_available", lambda: cores)
    monkeypatch.setattr(la, "_measure", lambda *a: ([0.05, 0.02, 0.02, 0.02], 100))
    advice = recommend_loader(SlowDataset(), 8, target_step_s=0.01, cuda=True)
    assert advice.num_workers == expected
    assert advice.load_s_per_batch == pytest.approx(0.02)  # the first batch is a warm-up
    if expected:
        assert advice.expected_load_s_per_batch == pytest.approx(0.02 / expected)
        assert advice.keeps_up == (0.02 / expected < 0.01)
        assert advice.pin_memory and advice.persistent_workers
    if expected < 3:
        assert any(line.startswith("input-bound") for line in advice.reasoning)


def test_no_target_all_but_one_core_and_max_workers(monkeypatch):
    monkeypatch.setattr(la, "cores_available", lambda: 16)
    assert recommend_loader(SlowDataset(), 8, sample_batches=0).num_workers == 15
    capped = recommend_loader(SlowDataset(), 8, sample_batches=0, max_workers=4)
    assert capped.num_workers == 4 and any("max_workers=4" in r for r in capped.reasoning)
    assert recommend_loader(SlowDataset(), 8, sample_batches=0, cuda=False).pin_memory is False


def test_advice_for_an_existing_loader():
    loader = DataLoader(SlowDataset(), batch_size=8)
    advice = advice_for_loader(loader, cuda=True)
    assert advice.load_s_per_batch is None and advice.batch_size == 8
    changes = advice.changes(loader)
    assert changes["pin_memory"] == (False, True)
    if advice.num_workers:
        assert changes["num_workers"] == (0, advice.num_workers)
    assert advice.changes(DataLoader(SlowDataset(), **advice.loader_kwargs())) == {}


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((SlowDataset(), 0), {}),
        ((SlowDataset(), 8), {"sample_batches": -1}),
        ((SlowDataset(), 8), {"max_workers": -2}),
        ((SlowDataset(), 8), {"target_step_s": 0}),
        ((42, 8), {}),
        ((TensorDataset(torch.zeros(0, 2)), 8), {}),
    ],
)
def test_bad_arguments(args, kwargs):
    with pytest.raises(DataPipelineError):
        recommend_loader(*args, **kwargs)
