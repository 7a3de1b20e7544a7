"""fused-optimizer: the same torch.optim optimizer rebuilt with fused=True (else foreach=True),
param_groups and state carried over, so training continues as the unfused one would."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpushape.transforms.fused_optimizer as fo
from gpushape.transforms import TransformError, fuse_optimizer


def _mlp(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)


def _batches(n: int, device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device))
        for _ in range(n)
    ]


def _step(model, opt, batch) -> None:
    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(batch[0]), batch[1]).backward()
    opt.step()


def _mid_training(make_opt, device: str = "cpu"):
    """A model and optimizer three steps in, with two param groups of different options."""
    model = _mlp(device)
    groups = [
        {"params": model[0].parameters(), "weight_decay": 0.1},
        {"params": model[2].parameters(), "lr": 3e-3},
    ]
    opt = make_opt(groups)
    for batch in _batches(3, device):
        _step(model, opt, batch)
    return model, opt


def _continues_identically(model, opt, device: str = "cpu") -> tuple[torch.optim.Optimizer, str]:
    """Fuse a copy of (model, opt); both train 4 more steps; parameters must agree."""
    ref_model, ref_opt = copy.deepcopy((model, opt))
    new, why = fuse_optimizer(opt)
    for batch in _batches(7, device)[3:]:
        _step(model, new, batch)
        _step(ref_model, ref_opt, batch)
    for got, want in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(got, want)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), _mlp(device).parameters()))
    return new, why


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda g: torch.optim.AdamW(g, lr=1e-2, foreach=False),
        lambda g: torch.optim.Adam(g, lr=1e-2, amsgrad=True, foreach=False),
        lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, nesterov=True, foreach=False),
    ],
    ids=["adamw", "adam-amsgrad", "sgd-nesterov"],
)
def test_fused_on_cpu_continues_training_identically(make_opt):
    model, opt = _mid_training(make_opt)
    new, why = _continues_identically(model, opt)
    assert new is not opt and type(new) is type(opt)
    assert all(g["fused"] for g in new.param_groups)
    assert "fused=True" in why and "state carried over" in why


def test_groups_and_state_carried_over():
    model, opt = _mid_training(lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.8, 0.99)))
    new, _ = fuse_optimizer(opt)
    for old_group, new_group in zip(opt.param_groups, new.param_groups):
        assert new_group["params"] == old_group["params"]
        for key in ("lr", "weight_decay", "betas", "eps", "amsgrad"):
            assert new_group[key] == old_group[key], key
    assert [g["lr"] for g in new.param_groups] == [1e-2, 3e-3]
    assert [g["weight_decay"] for g in new.param_groups] == [0.1, 1e-2]
    for p in model.parameters():
        assert new.state[p]["exp_avg"] is opt.state[p]["exp_avg"]  # taken over, not copied
        assert float(new.state[p]["step"]) == 3.0
        assert new.state[p]["step"].dtype == torch.float32
    assert new.defaults["fused"] is True


def test_already_fused_is_returned_as_is():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    same, why = fuse_optimizer(opt)
    assert same is opt and "already fused" in why


def test_no_fused_kernel_and_no_foreach_device_leaves_it():
    _, opt = _mid_training(lambda g: torch.optim.RMSprop(g, lr=1e-3))
    same, why = fuse_optimizer(opt)
    assert same is opt
    assert "RMSprop has no fused implementation" in why and "cpu" in why


def test_foreach_where_torch_takes_it(monkeypatch):
    """RMSprop has no fused kernel; where torch would take foreach (CUDA), foreach=True."""
    monkeypatch.setattr(fo, "_torch_would", lambda params, fused: (False, True))
    model, opt = _mid_training(lambda g: torch.optim.RMSprop(g, lr=1e-3, foreach=False))
    new, why = _continues_identically(model, opt)
    assert all(g["foreach"] is True for g in new.param_groups)
    assert "foreach=True" in why and "no fused implementation" in why


def test_differentiable_is_left_alone():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, differentiable=True)
    same, why = fuse_optimizer(opt)
    assert same is opt and "differentiable" in why


def test_refuses_optimizers_outside_torch_optim():
    class MyAdam(torch.optim.Adam):
        pass

    model = _mlp()
    with pytest.raises(TransformError, match=r"not one of torch\.optim's classes"):
        fuse_optimizer(MyAdam(model.parameters()))
    with pytest.raises(TransformError, match=r"not a torch\.optim optimizer"):
        fuse_optimizer(object())


def test_step_hooks_are_not_dropped_silently():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    opt.register_step_post_hook(lambda *args: None)
    same, why = fuse_optimizer(opt)
    assert same is opt and "hooks" in why


@pytest.mark.gpu
def test_fused_on_cuda_continues_training_identically():
    model, opt = _mid_training(lambda g: torch.optim.AdamW(g, lr=1e-2), device="cuda")
    new, why = _continues_identically(model, opt, device="cuda")
    assert all(g["fused"] for g in new.param_groups) and "cuda" in why
    assert all(new.state[p]["step"].device.type == "cuda" for p in model.parameters())
