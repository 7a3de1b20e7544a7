"""Residual gradients handed over between two batch_norm_act calls (`_ops.py`): a ResNet block's
output feeds the next block's convolution and, as its residual, that block's fused norm; the
consumer's backward hands the residual's gradient to the producer, whose kernels add it to the
gradient from the convolution (`_bwd_kernels.py`, HAS_DY2 / WRITE_DZ).

Every case is gated against PyTorch's own BatchNorm2d + add + activation chain, forward and every
gradient; spies check that the hand-over happened where it should and not where it must not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels.batch_norm.batch_norm_act import batch_norm_act

from ._batch_norm_cases import CF, CL, TORCH_ACT, _inputs, _keep_off_kinks
from ._numeric import gate_forward_backward

RUNNING = None


def _norm(ours: bool, training: bool, running):
    def fn(x, w, b, r, activation):
        rm, rv = (t.clone().to(x.device) for t in running)
        if ours:
            return batch_norm_act(x, w, b, rm, rv, training, 0.1, 1e-5, activation, r)
        stat = torch.float64 if x.dtype == torch.float64 else torch.float32
        y = F.batch_norm(x, rm.to(stat), rv.to(stat), w, b, training, 0.1, 1e-5) + r
        return TORCH_ACT[activation](y)

    return fn


def _chain(ours: bool, training: bool, running, acts=("relu", "relu"), consumers=1):
    """y1 = norm(x) + r, activation; h = conv(y1); y2 = norm(h) + y1, activation (and, with
    consumers=2, y3 = norm(h2) + y1 on a second convolution): y1 feeds a convolution and a
    residual, as between two ResNet blocks."""
    norm = _norm(ours, training, running)

    def fn(x, r, wc, w1, b1, w2, b2):
        y1 = norm(x, w1, b1, r, acts[0])
        out = norm(F.conv2d(y1, wc), w2, b2, y1, acts[1])
        if consumers == 2:
            out = out + norm(F.conv2d(y1, wc.flip(0)), w2, b2, y1, acts[1])
        return out

    return fn


def _chain_inputs(shape, dtype, fmt, training, act0, device="cpu"):
    x, w1, b1, r = _inputs(shape, dtype, fmt, device)
    running = (0.1 * torch.randn(shape[1]), 0.5 + torch.rand(shape[1]))
    if act0 == "relu":
        _keep_off_kinks(x, w1, b1, r, training, running, (0.0,))
    c = shape[1]
    wc = (torch.randn(c, c, 1, 1) / c**0.5).to(device, dtype).requires_grad_()
    w2 = (1 + 0.3 * torch.randn(c)).to(device).requires_grad_()
    b2 = (0.2 * torch.randn(c)).to(device).requires_grad_()
    return (x, r, wc, w1, b1, w2, b2), running


NAMES = ("x", "residual", "conv_weight", "weight1", "bias1", "weight2", "bias2")


def _gate_chain(shape, dtype, fmt, training=True, acts=("relu", "relu"), consumers=1, device="cpu"):
    torch.manual_seed(0)
    args, running = _chain_inputs(shape, dtype, fmt, training, acts[0], device)
    gate_forward_backward(
        _chain(True, training, running, acts, consumers),
        _chain(False, training, running, acts, consumers),
        args,
        names=NAMES,
        whole_backward=True,
    )


@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 16, 5, 7), (3, 9, 4, 5)], ids=["16ch", "9ch"])
def test_handed_over_gradient_gate(interpret, parts, shape, dtype, fmt):
    # the consumer without ReLU: its pre-activation depends on the producer's rounding, so a
    # bf16 element next to 0 may take the other side of ReLU's kink (the producer's ReLU, the
    # one that reads both parts, is kept off its kink); fp32 with both ReLUs: the variants
    _gate_chain(shape, dtype, fmt, acts=("relu", "none"))
    # three runs (ours, torch, float64): ours's producer read two parts, its consumer one
    assert parts == [False, True]


@pytest.mark.parametrize(
    ("training", "acts"),
    [(True, ("relu", "relu")), (False, ("relu", "relu")), (True, ("none", "relu"))],
    ids=["train", "eval", "producer-none"],
)
def test_handed_over_variants_gate(interpret, parts, training, acts):
    _gate_chain((2, 10, 6, 7), torch.float32, CL, training, acts)
    assert parts == [False, True]


def test_smooth_producer_adds_the_parts_first(interpret, parts):
    _gate_chain((2, 8, 5, 6), torch.float32, CL, acts=("silu", "relu"))
    assert parts == [False, True]


def test_two_residual_users_hand_over_both(interpret, parts):
    _gate_chain((2, 8, 5, 6), torch.float32, CL, consumers=2)
    assert parts.count(True) == 1 and len(parts) == 3


def test_reference_path_hands_over_too(parts, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _gate_chain((2, 12, 5, 3), torch.bfloat16, CL)
    assert parts == [False, True]


def _producer_and_consumer(dtype=torch.float32):
    torch.manual_seed(1)
    (x, r, wc, w1, b1, w2, b2), running = _chain_inputs((2, 8, 5, 6), dtype, CL, True, "relu")
    norm = _norm(True, True, running)
    y1 = norm(x, w1, b1, r, "relu")
    return y1, lambda: norm(F.conv2d(y1, wc), w2, b2, y1, "relu"), (x, r, wc, w1, b1, w2, b2)


def _full_grad_of_y1():
    """d(sum(y2 * g)) / d(y1), both uses of y1 counted, by the engine alone (y1 detached and
    fed to both uses as one leaf)."""
    y1, _, (*_, wc, _, _, w2, b2) = _producer_and_consumer()
    leaf = y1.detach().requires_grad_()
    running = (torch.zeros(8), torch.ones(8))
    norm = _norm(True, True, running)
    y2 = norm(F.conv2d(leaf, wc), w2, b2, leaf, "relu")
    g = torch.linspace(-1, 1, y2.numel()).reshape(y2.shape)
    (grad,) = torch.autograd.grad(y2, leaf, g)
    return grad, g


def test_a_hook_on_the_residual_sees_the_whole_gradient(interpret, parts):
    want, g = _full_grad_of_y1()
    y1, consumer, _ = _producer_and_consumer()
    got = []
    y1.register_hook(got.append)
    consumer().backward(g)
    torch.testing.assert_close(got[0], want)
    assert True not in parts  # nothing handed over: the hook must see both parts


def test_retain_grad_sees_the_whole_gradient(interpret, parts):
    want, g = _full_grad_of_y1()
    y1, consumer, _ = _producer_and_consumer()
    y1.retain_grad()
    consumer().backward(g)
    torch.testing.assert_close(y1.grad, want)
    assert True not in parts


def test_autograd_grad_of_the_residual_itself_is_whole(interpret, parts):
    want, g = _full_grad_of_y1()
    y1, consumer, _ = _producer_and_consumer()
    (got,) = torch.autograd.grad(consumer(), y1, g)
    torch.testing.assert_close(got, want)
    assert True not in parts  # the producer does not run: nothing may be handed to it


def test_output_used_only_as_a_residual(interpret, parts):
    """The producer's output feeds nothing but the residual: its backward gets dy = None and
    takes the handed-over part as its whole gradient."""
    torch.manual_seed(2)
    (x, r, wc, w1, b1, w2, b2), running = _chain_inputs(
        (2, 8, 5, 6), torch.float32, CL, True, "relu"
    )

    def chain(ours):
        norm = _norm(ours, True, running)

        def fn(x, r, wc, w1, b1, w2, b2):
            y1 = norm(x, w1, b1, r, "relu")
            h = F.conv2d(x.detach(), wc)  # the convolution does not read y1
            return norm(h, w2, b2, y1, "relu")

        return fn

    args = (x, r, wc, w1, b1, w2, b2)
    gate_forward_backward(chain(True), chain(False), args, names=NAMES, whole_backward=True)
    assert parts == [False, False]  # one part, taken as dy itself


def test_repeated_backward_hands_over_each_time(interpret, parts):
    _y1, consumer, (x, *_) = _producer_and_consumer()  # y1 stays alive, as in a model
    y2 = consumer()
    g = torch.randn_like(y2)
    y2.backward(g, retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    y2.backward(g)
    torch.testing.assert_close(x.grad, first, rtol=0, atol=0)
    assert parts == [False, True, False, True]


# ---- on a CUDA GPU (`pytest -m gpu`) ----


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((16, 256, 14, 14), torch.bfloat16), ((8, 64, 56, 56), torch.float32)],
    ids=["16x256x14x14-bf16", "8x64x56x56-fp32"],
)
@pytest.mark.parametrize("fmt", [CL, CF], ids=["channels_last", "nchw"])
def test_gpu_handed_over_gradient_gate(parts, shape, dtype, fmt):
    _gate_chain(shape, dtype, fmt, acts=("relu", "none"), device="cuda")
    assert parts == [False, True]


@pytest.mark.gpu
def test_gpu_handover_in_a_captured_step_equals_eager():
    """The whole step (forward, backward) captured in one CUDA graph and replayed on new
    inputs gives the eager step's gradients bit for bit: the parts handed over during capture
    are the graph's own buffers."""
    torch.manual_seed(3)
    args, running = _chain_inputs((16, 256, 14, 14), torch.bfloat16, CL, True, "relu", "cuda")
    fn = _chain(True, True, tuple(t.cuda() for t in running))  # no host copy while capturing
    static = [a.detach().clone().requires_grad_() for a in args]

    def step():
        for a in static:
            a.grad = None
        fn(*static).backward(torch.ones_like(static[0]))
        return [a.grad for a in static]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: plans built, kernels compiled
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    for replay in range(2):
        fresh = [a.detach() * (1 + 0.1 * replay) + 0.01 for a in args]
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        eager = [f.clone().requires_grad_() for f in fresh]
        fn(*eager).backward(torch.ones_like(eager[0]))
        for name, got, want in zip(NAMES, grads, (e.grad for e in eager)):
            assert torch.equal(got, want), name
