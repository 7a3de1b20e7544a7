"""graph-layers' links on the CPU: which arguments the observed forward shows to be an earlier
layer's output (what the graphs read in place, `_graph_capture.py`), the layers run alone as the
model feeds them, and a graphed layer whose linked argument arrives at another address running
its own forward. The capture itself needs a GPU (test_graph_layers_capture_gpu.py)."""

from __future__ import annotations

import torch
from tests.transforms.test_graph_layers import Block, Net, _apply
from torch import nn

from gpushape.transforms import graph_layers
from gpushape.transforms._graph_calls import observe
from gpushape.transforms._graph_check import layers_run
from gpushape.transforms._graph_replay import MARK


class _Detour(nn.Module):
    """Layer 1 reads a tensor made between the layers; layer 2 reads layer 1's output."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        h, _ = self.layers[0](x)
        h, _ = self.layers[1](h * 2)
        h, _ = self.layers[2](h)
        return h


def _picked(model, x):
    layers = dict(graph_layers.layer_stacks(model)[0][1])
    calls = observe(model, layers, (x,))
    return {name: (layer, calls[name][0]) for name, layer in layers.items()}


def test_links_are_the_outputs_the_next_layers_read():
    x = torch.randn(2, 16)
    picked = _picked(Net().train(), x)
    assert [c.sources for _, c in picked.values()] == [
        [None],  # the stem's output, not a layer's
        [("layers.0", 0)],
        [("layers.1", 0)],
    ]
    assert graph_layers.links_of(picked) == {(1, 0): (0, 0), (2, 0): (1, 0)}
    detour = _picked(_Detour().train(), x)
    assert graph_layers.links_of(detour) == {(2, 0): (1, 0)}


def test_no_link_where_the_argument_needs_no_gradient():
    model, x = Net().train(), torch.randn(2, 16)
    for p in model.parameters():
        p.requires_grad_(False)
    picked = _picked(model, x)
    assert picked["layers.1"][1].sources == [("layers.0", 0)]
    assert graph_layers.links_of(picked) == {}  # layer 0's output requires no grad


def test_the_layers_run_alone_as_the_model_feeds_them():
    torch.manual_seed(0)
    model, x = Net().train(), torch.randn(2, 16)
    picked = _picked(model, x)
    seen = []

    def call(layer):
        def run(*args):
            seen.append(args[0])
            return (layer(*args)[0],)

        return run

    calls = [call(layer) for layer, _ in picked.values()]
    samples = [(torch.randn(2, 16, requires_grad=True),) for _ in calls]
    run = layers_run(calls, samples, graph_layers.links_of(picked))
    run()
    assert seen[0] is samples[0][0] and seen[1] is not samples[1][0]
    # only the last layer's output got a gradient of ones: the first's parameters were reached
    # through the chain, and the unused samples got none
    assert all(p.grad is not None for p in picked["layers.0"][0].parameters())
    assert samples[1][0].grad is None and samples[2][0].grad is None


def test_a_linked_argument_at_another_address_runs_the_layer_eagerly(fake_graphs):
    torch.manual_seed(0)
    model, x = Net().train(), torch.randn(2, 16)
    assert len(_apply(model, x).changes) == 3
    fake_graphs.clear()
    h = model.inp(x)
    first, _ = model.layers[0](h, mask=None)  # as Net calls it
    state = model.layers[1].__dict__[MARK]
    state.linked = {0: first.data_ptr()}  # what the real capture records
    model.layers[1](first, mask=None)
    assert len(fake_graphs) == 2  # both replayed: layer 1's argument is where it must be
    fake_graphs.clear()
    model.layers[1](first.clone(), mask=None)
    assert fake_graphs == []  # elsewhere: its own forward, leaving layer 0's output alone
