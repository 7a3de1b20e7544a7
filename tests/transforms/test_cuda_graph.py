"""cuda-graphs: what stops a training step from being captured, optimizers made capturable with
their state, and (on a GPU) a whole AdamW step captured and replayed as eager would run it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpushape.transforms import (
    GraphCaptureError,
    capture_reasons,
    capture_step,
    capture_warnings,
    make_capturable,
)

CUDA = torch.cuda.is_available()


def _mlp(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)


def _batches(n: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [
        (torch.randn(8, 16, generator=g).to(device), torch.randn(8, 4, generator=g).to(device))
        for _ in range(n)
    ]


def _train_step(model, opt):
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


# ---- capture_reasons: what can be checked before trying ------------------------------------
def test_reasons_name_cpu_parameters_inputs_and_a_non_capturable_adam():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    reasons = capture_reasons(model, opt, (torch.randn(8, 16), 3))
    text = "\n".join(reasons)
    assert "4 parameters/buffers are not on CUDA: 0.weight (cpu), 0.bias (cpu), 2.weight" in text
    assert "and 1 more" in text
    assert "1 inputs are not on CUDA" in text and "input 0 (cpu)" in text
    assert "AdamW is not capturable" in text and "capturable=True" in text
    assert ("no CUDA device" in text) is not CUDA
    assert all("\n" not in r for r in reasons)


def test_capturable_sgd_and_fused_adagrad_raise_no_optimizer_reason():
    model = _mlp()
    for opt in (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        torch.optim.Adam(model.parameters(), capturable=True),
        torch.optim.Adagrad(model.parameters(), fused=True),
    ):
        reasons = capture_reasons(model, opt)
        assert not any(type(opt).__name__ in r for r in reasons), reasons


def test_fused_adam_without_capturable_and_plain_adagrad_are_named():
    model = _mlp()
    fused = capture_reasons(model, torch.optim.Adam(model.parameters(), fused=True))
    assert any("fused needs it too" in r for r in fused)
    adagrad = capture_reasons(model, torch.optim.Adagrad(model.parameters()))
    assert any("Adagrad keeps its step count on the CPU" in r for r in adagrad)


def test_hooks_are_warnings_not_reasons():
    model = _mlp()
    assert capture_warnings(model) == []
    model[2].register_forward_hook(lambda *args: None)
    assert capture_warnings(model) == ["hooks run only while capturing, not on replays: 2"]


# ---- make_capturable ------------------------------------------------------------------------
def _stepped_adamw():
    model = _mlp()
    groups = [
        {"params": model[0].parameters(), "lr": 1e-2},
        {"params": model[2].parameters(), "weight_decay": 0.2},
    ]
    opt = torch.optim.AdamW(groups, lr=3e-3)
    for x, y in _batches(2, "cpu"):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt


def test_make_capturable_keeps_groups_and_state():
    model, opt = _stepped_adamw()
    before = copy.deepcopy(opt.state_dict())
    new = make_capturable(opt)
    assert new is not opt and type(new) is torch.optim.AdamW
    assert all(g["capturable"] for g in new.param_groups)
    assert [g["lr"] for g in new.param_groups] == [1e-2, 3e-3]
    assert [g["weight_decay"] for g in new.param_groups] == [1e-2, 0.2]
    for i, p in enumerate(model.parameters()):
        state = new.state[p]
        assert float(state["step"]) == 2.0 and state["step"].device == p.device
        torch.testing.assert_close(state["exp_avg"], before["state"][i]["exp_avg"])
        torch.testing.assert_close(state["exp_avg_sq"], before["state"][i]["exp_avg_sq"])
    assert not any("AdamW" in r for r in capture_reasons(model, new))


def test_make_capturable_returns_capturable_and_sgd_as_they_are():
    model = _mlp()
    capturable = torch.optim.Adam(model.parameters(), capturable=True)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert make_capturable(capturable) is capturable
    assert make_capturable(sgd) is sgd


@pytest.mark.parametrize("cls", [torch.optim.Adagrad, torch.optim.LBFGS])
def test_make_capturable_refuses_classes_without_the_option(cls):
    with pytest.raises(GraphCaptureError, match=f"{cls.__name__} has no capturable option"):
        make_capturable(cls(_mlp().parameters()))


@pytest.mark.skipif(CUDA, reason="checks the error on a machine without CUDA")
def test_capture_step_needs_cuda():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GraphCaptureError, match="needs a CUDA device"):
        capture_step(_train_step(model, opt), *_batches(1, "cpu")[0])


# ---- on the GPU: a whole step captured and replayed ---------------------------------------
def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True, fused=True)


@pytest.mark.gpu
def test_replays_equal_eager_steps():
    batches = _batches(4, "cuda")
    graphed_model, eager_model = _mlp("cuda"), _mlp("cuda")
    graphed_opt, eager_opt = _adamw(graphed_model), _adamw(eager_model)
    static_x, static_y = (t.clone() for t in batches[0])
    step = _train_step(graphed_model, graphed_opt)
    graphed = capture_step(step, static_x, static_y, warmup=3, optimizer=graphed_opt)
    losses = [graphed(x, y).clone() for x, y in batches[1:]]
    # eager: the three warm-up steps on the first batch, then the same three batches
    eager_step = _train_step(eager_model, eager_opt)
    for x, y in [batches[0]] * 3 + batches[1:]:
        eager_opt.zero_grad(set_to_none=True)
        want = eager_step(x, y)
    torch.testing.assert_close(losses[-1], want)
    for got, want in zip(graphed_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want)
    assert graphed.step_fn is step
    assert all(a is b for a, b in zip(graphed.static_inputs, (static_x, static_y)))


@pytest.mark.gpu
def test_nothing_stands_in_the_way_of_a_cuda_step():
    model = _mlp("cuda")
    assert capture_reasons(model, _adamw(model), _batches(1, "cuda")[0]) == []
    assert capture_reasons(model, make_capturable(torch.optim.AdamW(model.parameters()))) == []


@pytest.mark.gpu
def test_replay_refuses_another_shape():
    model = _mlp("cuda")
    opt = _adamw(model)
    graphed = capture_step(_train_step(model, opt), *_batches(1, "cuda")[0], optimizer=opt)
    with pytest.raises(GraphCaptureError, match=r"input 0 is \(4, 16\).*captured with \(8, 16\)"):
        graphed(torch.randn(4, 16, device="cuda"), torch.randn(4, 4, device="cuda"))


@pytest.mark.gpu
def test_a_host_read_inside_the_step_is_a_capture_error():
    model = _mlp("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        loss = F.mse_loss(model(x), y)
        if loss.item() > 0:  # reads the GPU's value on the host: not capturable
            loss.backward()
        opt.step()
        return loss

    with pytest.raises(GraphCaptureError, match="cannot capture this step") as info:
        capture_step(step, *_batches(1, "cuda")[0], optimizer=opt)
    assert info.value.__cause__ is not None
    # CUDA still usable afterwards: the stream restored, random numbers drawn, a step captured
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert torch.randn(2, device="cuda").shape == (2,)
    model.insert(1, nn.Dropout(0.1))
    graphed = capture_step(_train_step(model, opt), *_batches(1, "cuda")[0], optimizer=opt)
    assert torch.isfinite(graphed()).all()


def test_a_hugging_face_model_is_warned_about_its_masks_under_capture(monkeypatch):
    pytest.importorskip("transformers")
    from _hf_masks import old_masks

    from .nets import tiny_gpt2

    with old_masks():  # a release that builds the mask while capturing (up to 5.17)
        (warning,) = capture_warnings(tiny_gpt2())
    assert "explicit attention mask" in warning
    monkeypatch.setattr("gpushape.models.hf_masks._materialises_when_tracing", lambda: False)
    assert capture_warnings(tiny_gpt2()) == []  # a release that skips it
    assert capture_warnings(nn.Linear(2, 2)) == []
