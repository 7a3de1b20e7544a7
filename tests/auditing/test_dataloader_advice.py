"""The dataloader rule says what to set, from gpushape.data's loader advice."""

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpushape
from gpushape.data import advice_for_loader, cores_available


def test_dataloader_finding_names_the_recommended_settings():
    model = torch.nn.Linear(8, 8)
    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4)
    report = gpushape.audit(model, (torch.randn(4, 8),), gpu="h200", dataloader=loader)
    (workers,) = [
        f for f in report.findings if f.rule == "dataloader" and "num_workers" in f.message
    ]
    assert f"of {cores_available()} cores" in workers.message
    assert workers.evidence["recommended"] == advice_for_loader(loader).loader_kwargs()
    assert workers.evidence["reasoning"]
