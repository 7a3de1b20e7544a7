"""Linear bias gradients by a GEMV (transforms/_bias_grad.py): the function against F.linear,
forward and every gradient, and the mode that reroutes F.linear while graph-layers captures."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from tests.kernel_ops._numeric import gate_forward_backward
from tests.transforms.nets import autograd_node_names
from torch import nn

from gpushape.transforms import _bias_grad
from gpushape.transforms._bias_grad import gemv_bias_grads, linear_gemv_bias


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(64, 48), (2, 33, 48), (3, 2, 5, 48)])
def test_equals_f_linear_forward_and_every_gradient(shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    w = (torch.randn(40, 48) / 7).to(dtype).requires_grad_()
    b = torch.randn(40, dtype=dtype, requires_grad=True)
    gate_forward_backward(linear_gemv_bias, F.linear, [x, w, b], names=["x", "weight", "bias"])


@pytest.mark.parametrize("needs", [(False, True, True), (True, False, True), (False, False, True)])
def test_only_the_gradients_asked_for(needs):
    x = torch.randn(8, 6, dtype=torch.float64, requires_grad=needs[0])
    w = torch.randn(5, 6, dtype=torch.float64, requires_grad=needs[1])
    b = torch.randn(5, dtype=torch.float64, requires_grad=needs[2])
    linear_gemv_bias(x, w, b).pow(2).sum().backward()
    assert (x.grad is not None, w.grad is not None, b.grad is not None) == needs
    ref = b.detach().clone().requires_grad_()
    F.linear(x.detach(), w.detach(), ref).pow(2).sum().backward()
    torch.testing.assert_close(b.grad, ref.grad)


def test_the_mode_reroutes_only_the_calls_it_is_for(monkeypatch):
    monkeypatch.setattr(_bias_grad, "MIN_ROWS", 16)
    monkeypatch.setattr(_bias_grad, "MAX_OUT", 32)
    lin = nn.Linear(8, 24).to(torch.bfloat16)
    wide = nn.Linear(8, 40).to(torch.bfloat16)  # wider than MAX_OUT
    x = torch.randn(4, 8, 8, dtype=torch.bfloat16)  # 32 rows
    with gemv_bias_grads() as mode:
        y = lin(x)
        lin(x[:1])  # 8 rows: fewer than MIN_ROWS
        wide(x)
        lin.float()(x.float())  # fp32: PyTorch's reduction is kept
        lin.to(torch.bfloat16)
        with torch.no_grad():
            lin(x)
    assert mode.weights == {id(lin.weight)}
    assert y.grad_fn is not None and "LinearGemvBias" in type(y.grad_fn).__name__


def test_a_bert_layer_under_the_mode_equals_itself_without():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    layer = transformers.models.bert.modeling_bert.BertLayer(config).to(torch.bfloat16).train()
    x = torch.randn(2, 512, 64, dtype=torch.bfloat16)  # 1,024 rows: MIN_ROWS

    def run(mode):
        layer.zero_grad(set_to_none=True)
        h = x.clone().requires_grad_()
        with mode:
            out = layer(h)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()
        return out.detach(), h.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}

    rerouted = gemv_bias_grads()
    got, ref = run(rerouted), run(contextlib.nullcontext())
    assert len(rerouted.weights) == 6  # query, key, value, attention output, intermediate, output
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=1e-4)
    for name, g in ref[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=2e-2, atol=1e-3, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows, width", [(2048, 768), (16384, 3072)])
def test_on_the_gpu_at_bert_sizes(rows, width):
    x = torch.randn(rows, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(width, 768, device="cuda") / 28).bfloat16().requires_grad_()
    b = torch.randn(width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gate_forward_backward(linear_gemv_bias, F.linear, [x, w, b], names=["x", "weight", "bias"])


def test_only_the_named_weights_are_rerouted(monkeypatch):
    monkeypatch.setattr(_bias_grad, "MIN_ROWS", 16)
    a, b = (nn.Linear(8, 24).to(torch.bfloat16) for _ in range(2))
    x = torch.randn(32, 8, dtype=torch.bfloat16)
    with gemv_bias_grads(only={id(a.weight)}) as mode:
        ya, yb = a(x), b(x)
    assert mode.weights == {id(a.weight)}
    assert "LinearGemvBias" in type(ya.grad_fn).__name__
    assert "LinearGemvBias" not in type(yb.grad_fn).__name__


def test_a_graphed_layer_captured_inside_a_whole_step_keeps_its_gemv(monkeypatch):
    """cuda-graphs after graph-layers: a stream capturing the whole step runs each graphed layer
    eagerly, and then with the bias gradients the layer's graphs took by a GEMV (its own
    Linears only); outside a capture the layer's own forward runs as it is."""
    from gpushape.transforms import _graph_replay
    from gpushape.transforms._graph_replay import MARK, GraphedForward, LayerState

    monkeypatch.setattr(_bias_grad, "MIN_ROWS", 16)
    block = nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8)).to(torch.bfloat16)
    state = LayerState(None, None)  # no capture to match: every call takes the layer's forward
    state.gemv_weights = {id(block[0].weight)}
    block.__dict__[MARK] = state
    block.forward = GraphedForward(block)
    x = torch.randn(32, 8, dtype=torch.bfloat16, requires_grad=True)
    gemv = "LinearGemvBias"

    def gemv_nodes(out) -> int:  # the GEMV Functions in out's autograd graph
        return sum(gemv in name for name in autograd_node_names(out))

    assert gemv_nodes(block(x)) == 0
    monkeypatch.setattr(_graph_replay, "_capturing", lambda: True)
    out = block(x)
    assert gemv_nodes(out) == 1  # the first Linear's: the second was not the graphs'
    got = torch.autograd.grad(out.float().square().sum(), [x, *block.parameters()])
    block.__dict__.pop("forward")
    ref = torch.autograd.grad(block(x).float().square().sum(), [x, *block.parameters()])
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
