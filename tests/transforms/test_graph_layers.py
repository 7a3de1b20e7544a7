"""graph-layers on the CPU: which layers it finds (Hugging Face BERT and GPT-2, the zoo's ResNet,
nested stacks), what it refuses and why (no GPU, compile and graph mode, eval mode, hooks, a
layer called twice), and how a graphed layer routes its calls: captured arguments replay, any
other call (eval mode, no autograd, another shape, another flag) runs the layer's own forward;
copies run eagerly; revert, idempotence, state_dict. CUDA graphs need a GPU: here the
capture (`_graph_capture.graphed_callables`) is replaced by one that returns the layers'
positional adapters unchanged, which run eagerly and count their calls. The replay itself
(outputs, every gradient, gradient accumulation, dropout from one seed) is tested on the GPU
(test_graph_layers_gpu.py)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from gpushape.transforms import _core, graph_layers, optimize, revert
from gpushape.transforms._core import TransformContext


class Block(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.drop = nn.Dropout(0.0)

    def forward(self, x, mask=None, scale: float = 1.0):
        y = self.drop(torch.relu(self.lin(x))) * scale
        return (x + y, None) if mask is None else (x + y * mask, None)


class Net(nn.Module):
    def __init__(self, layers: int = 3, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))
        self.out = nn.Linear(width, 4)

    def forward(self, x, mask=None):
        h = self.inp(x)
        for layer in self.layers:
            h, _ = layer(h, mask=mask)
        return self.out(h)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.Sequential(
            nn.Sequential(Block(), Block()), nn.Sequential(Block(), Block())
        )
        self.heads = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        return self.stages(x)


def _ctx(x, **kw):
    return TransformContext(example_inputs=(x,), **kw)


def _apply(model, x):
    return graph_layers.apply(model, _ctx(x))


# ---- finding the layers ------------------------------------------------------------------
def test_stacks_of_the_zoo_and_nested():
    from gpushape.models import resolve_model

    resnet = resolve_model("resnet50", device="meta").model
    assert [(n, len(m)) for n, m in graph_layers.layer_stacks(resnet)] == [
        ("layer1", 3), ("layer2", 4), ("layer3", 6), ("layer4", 3)
    ]  # fmt: skip
    names = [n for n, _ in graph_layers.layer_stacks(Nested())]
    assert names == ["stages.0", "stages.1", "heads"]  # Sequential of Sequentials: the inner ones


def test_stacks_of_hugging_face_models():
    pytest.importorskip("transformers")
    from gpushape.models.library import hf_model

    tiny = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
    bert, _ = hf_model("bert", **tiny)
    assert [(n, len(m)) for n, m in graph_layers.layer_stacks(bert)] == [("bert.encoder.layer", 2)]
    gpt2, _ = hf_model("gpt2", n_layer=3, n_embd=64, n_head=4)
    assert [(n, len(m)) for n, m in graph_layers.layer_stacks(gpt2)] == [("transformer.h", 3)]


# ---- refusals ------------------------------------------------------------------------------
def test_refuses_without_a_gpu_and_outside_eager_training():
    model, x = Net(), torch.randn(2, 16)
    why = graph_layers.apply(model, _ctx(x)).refusals
    assert [r.reason for r in why] == ["needs the model on a CUDA GPU (it captures CUDA graphs)"]
    for mode, words in (("compile", "reduce-overhead"), ("graph", "whole step")):
        (r,) = graph_layers.apply(model, _ctx(x, mode=mode)).refusals
        assert words in r.reason
    (r,) = graph_layers.apply(model, _ctx(x, train=False)).refusals
    assert "training step" in r.reason
    assert not any(graph_layers.is_graphed(b) for b in model.layers)


def test_optimize_on_the_cpu_leaves_the_model_alone():
    model, x = Net(), torch.randn(2, 16)
    state = copy.deepcopy(model.state_dict())
    model, report = optimize(model, (x,), "h200", train=True)
    assert not any(c.transform == "graph-layers" for c in report.applied)
    assert not any(r.transform == "graph-layers" for r in report.refused)  # not tried: no GPU
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_refuses_hooked_and_twice_called_layers(fake_graphs):
    model, x = Net(), torch.randn(2, 16)
    model.layers[0].register_forward_hook(lambda *a: None)
    out = _apply(model, x)
    assert [(r.module, "hooks" in r.reason) for r in out.refusals] == [("layers.0", True)]
    assert [c.module for c in out.changes] == ["layers.1", "layers.2"]

    twice = Net()
    twice.layers[2] = twice.layers[1]  # one module at two places: called twice a forward
    out = _apply(twice, x)
    assert any("called 2 times" in r.reason for r in out.refusals)


# ---- routing ------------------------------------------------------------------------------
def test_captured_calls_replay_and_others_run_eagerly(fake_graphs):
    torch.manual_seed(0)
    model, x = Net().train(), torch.randn(2, 16, requires_grad=True)
    ref = copy.deepcopy(model)
    out = _apply(model, x)
    assert [c.module for c in out.changes] == ["layers.0", "layers.1", "layers.2"]
    fake_graphs.clear()
    y = model(x)
    assert len(fake_graphs) == 3  # every layer replayed
    torch.testing.assert_close(y, ref(x))
    y.sum().backward()
    ref(x).sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)

    def replays(run) -> int:
        fake_graphs.clear()
        run()
        return len(fake_graphs)

    assert replays(lambda: model(torch.randn(3, 16))) == 0  # another shape
    assert replays(lambda: model(x, mask=torch.ones(2, 16))) == 0  # a mask where none was
    with torch.no_grad():
        assert replays(lambda: model(x)) == 0
    model.eval()
    assert replays(lambda: model(x)) == 0
    model.train()
    assert replays(lambda: model.layers[0](model.inp(x), scale=2.0)) == 0  # another flag
    assert replays(lambda: model(x)) == 3


def test_copies_run_eagerly_and_state_dict_is_unchanged(fake_graphs):
    model, x = Net().train(), torch.randn(2, 16)
    keys = list(model.state_dict())
    _apply(model, x)
    assert list(model.state_dict()) == keys
    Net().load_state_dict(model.state_dict(), strict=True)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    model.load_state_dict(torch.load(buf), strict=True)
    twin = copy.deepcopy(model)
    unpickled = pickle.loads(pickle.dumps(model))
    fake_graphs.clear()
    torch.testing.assert_close(twin(x), model(x))
    torch.testing.assert_close(unpickled(x), model(x))
    assert len(fake_graphs) == 6  # the original's two calls replay, the copies run eagerly
    assert not any(graph_layers.is_graphed(b) for b in twin.layers)


def test_twice_equals_once_and_revert(fake_graphs):
    model, x = Net().train(), torch.randn(2, 16)
    first = _apply(model, x)
    again = _apply(model, x)
    assert first.changes and not again.changes
    _core.undo(first.changes)
    assert all("forward" not in b.__dict__ and graph_layers.MARK not in b.__dict__
               for b in model.layers)  # fmt: skip


def test_optimize_asked_by_name_and_revert(fake_graphs):
    model, x = Net().train(), torch.randn(2, 16)
    model, report = optimize(model, (x,), "h200", train=True, transforms=["graph-layers"])
    assert sum(c.transform == "graph-layers" for c in report.applied) == 3
    revert(model)
    assert not any(graph_layers.is_graphed(b) for b in model.layers)


@pytest.mark.parametrize(
    "kind, size",
    [
        ("bert", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                      intermediate_size=128)),
        ("gpt2", dict(n_layer=2, n_embd=64, n_head=4)),
        ("llama", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128)),
    ],
)  # fmt: skip
def test_hugging_face_layers_route_their_calls(fake_graphs, kind, size):
    """Hugging Face calls its layers with keyword arguments (masks, position embeddings as a
    tuple of tensors, cache positions): each layer's call replays, and the outputs and every
    gradient equal the model's own."""
    pytest.importorskip("transformers")
    from gpushape.models.library import hf_model

    model, _ = hf_model(kind, device="cpu", dtype=torch.float32, vocab_size=256, **size)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    model.train()
    if kind != "bert":  # decoders build a key/value cache each forward unless told not to
        (why,) = {r.reason for r in _apply(model, ids).refusals}
        assert "DynamicCache" in why and "use_cache=False" in why
        model.config.use_cache = False
    torch.manual_seed(0)
    for p in model.parameters():
        p.data = torch.randn_like(p) * 0.05
    model.train()
    for m in model.modules():  # dropout off: the stand-in capture runs eagerly, unseeded
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    if hasattr(model.config, "attention_dropout"):
        model.config.attention_dropout = 0.0
    ref = copy.deepcopy(model)
    out = _apply(model, ids)
    assert len(out.changes) == 2, out.refusals
    fake_graphs.clear()
    logits = model(ids).logits
    assert len(fake_graphs) == 2
    expected = ref(ids).logits
    torch.testing.assert_close(logits, expected)
    logits.sum().backward()
    expected.sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None, n
        else:
            torch.testing.assert_close(p.grad, q.grad, msg=n)


class ConvBlock(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return x + torch.relu(self.bn(self.conv(x)))


def test_channels_last_inputs_and_running_statistics(fake_graphs):
    """A channels_last layer is captured channels_last (a contiguous call runs eagerly), and
    the runs the transform makes (observing, capturing, checking) leave BatchNorm's running
    statistics as they were."""
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Sequential(ConvBlock(), ConvBlock())).train()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_b" in k}
    out = _apply(model, x)
    assert [c.module for c in out.changes] == ["1.0", "1.1"]
    for k, v in stats.items():
        assert torch.equal(model.state_dict()[k], v), k
    (call,) = [model[1][0].__dict__[graph_layers.MARK].call]
    h = model[0](x)
    assert call.tensors[0][1] == h.stride() != h.contiguous().stride()
    fake_graphs.clear()
    model[1](h)
    assert len(fake_graphs) == 2
    fake_graphs.clear()
    model[1](h.contiguous())
    assert not fake_graphs


def test_a_gradient_still_in_the_graphs_buffer_is_copied_before_a_replay():
    """A replay's backward writes the graph's gradient buffers: a .grad that is one of them
    (kept by zeroing in place, or accumulating) becomes a copy first; other gradients and None
    are left alone."""
    from gpushape.transforms._graph_replay import LayerState, own_gradients

    a, b, c = (nn.Parameter(torch.zeros(4)) for _ in range(3))
    buffer = torch.ones(4)
    a.grad, b.grad = buffer, torch.full((4,), 2.0)  # a's is the "graph's buffer"
    state = LayerState(None, None)
    state.params, state.static = [a, b, c], {buffer.data_ptr()}
    kept = b.grad
    own_gradients(state)
    assert a.grad is not buffer and a.grad.data_ptr() != buffer.data_ptr()
    assert torch.equal(a.grad, buffer)
    assert b.grad is kept and c.grad is None


def test_blocks_rewritten_by_torch_fx_still_form_a_stack():
    """fuse-norm-act turns a block into a torch.fx GraphModule, a class of its own per
    instance: a stage of such blocks is still a stack (torchvision's ResNet-50 after optimize)."""
    from gpushape.models import resolve_model
    from gpushape.transforms import optimize

    resnet = resolve_model("resnet50", batch=2, device="meta")
    model, report = optimize(
        resnet.model, resnet.example_inputs, "h200", transforms=["fuse-norm-act"]
    )
    assert any(c.transform == "fuse-norm-act" for c in report.applied)
    assert isinstance(model.layer1[0], torch.fx.GraphModule)
    assert [(n, len(m)) for n, m in graph_layers.layer_stacks(model)] == [
        ("layer1", 3), ("layer2", 4), ("layer3", 6), ("layer4", 3)
    ]  # fmt: skip


def test_a_decoder_trained_without_its_cache_by_no_kv_cache_is_captured(fake_graphs):
    """GPT-2's layers take the key/value cache each forward, which a replay would not update;
    once no-kv-cache runs its training forwards without the cache they are captured."""
    pytest.importorskip("transformers")
    from gpushape.models.library import hf_model
    from gpushape.transforms import no_kv_cache

    model, _ = hf_model("gpt2", device="cpu", dtype=torch.float32, vocab_size=256, n_layer=2,
                        n_embd=64, n_head=4)  # fmt: skip
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for p in model.parameters():
        p.data = torch.randn_like(p) * 0.05
    model.train()
    assert _apply(model, ids).changes == []  # the cache: refused
    assert no_kv_cache.apply(model, _ctx(ids)).changes
    out = _apply(model, ids)
    assert len(out.changes) == 2, out.refusals
    assert model.config.use_cache is True  # the config untouched
