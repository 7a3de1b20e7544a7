"""cuda-graphs after graph-layers, on the GPU: a whole training step captured around graphed
layers runs them eagerly into its own graph, with their Linears' bias gradients by the same
GEMV their own graphs use (transforms/_graph_replay.py), and its replays' gradients equal the
step's without the whole-step graph. Run on the GPU machine: pytest -m gpu."""

from __future__ import annotations

import pytest
import torch
from tests.transforms.nets import autograd_node_names
from torch import nn

from gpushape.transforms import graph_layers
from gpushape.transforms._core import TransformContext
from gpushape.transforms.cuda_graph import capture_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_whole_step_captured_around_graphed_layers_keeps_their_gemv():
    torch.manual_seed(0)
    model = _Stack().cuda().to(torch.bfloat16).train()
    x = torch.randn(1024, 64, device="cuda", dtype=torch.bfloat16)  # 1,024 rows: MIN_ROWS
    out = graph_layers.apply(model, TransformContext(example_inputs=(x,)))
    assert [c.module for c in out.changes] == [f"blocks.{i}" for i in range(3)], out.refusals
    assert all("GEMV" in c.detail for c in out.changes)
    names: list[list[str]] = []

    def step(inp):
        loss = model(inp).float().square().mean()
        names.append(autograd_node_names(loss))
        loss.backward()
        return loss

    # the step as graph-layers runs it: the layers replayed from their graphs
    model.zero_grad(set_to_none=True)
    step(x)
    replayed = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the parameters stay put
    graphed = capture_step(step, x, optimizer=optimizer, warmup=2)
    captured = names[-1]  # the capture's own forward ran each layer eagerly
    assert sum("LinearGemvBias" in n for n in captured) == 6  # up and down of 3 blocks
    graphed(x)
    torch.cuda.synchronize()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, replayed[name], rtol=2e-2, atol=1e-4, msg=name)


def test_chained_layers_read_each_other_in_place_and_train_as_eager():
    """Blocks 1 and 2 read the previous block's output where it lies, and block 0's and 1's
    backward the next block's input gradient: only block 0's input and block 2's output
    gradient are copied into the graphs. The steps equal eager ones; a linked block called with
    another tensor runs eagerly and leaves the earlier block's output as it was."""
    import copy

    from gpushape.transforms._graph_replay import MARK

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model = _Stack().cuda().train()
    ref = copy.deepcopy(model)
    x = torch.randn(256, 64, device="cuda")
    out = graph_layers.apply(model, TransformContext(example_inputs=(x,)))
    assert len(out.changes) == 3, out.refusals
    states = [b.__dict__[MARK] for b in model.blocks]
    assert [sorted(s.linked) for s in states] == [[], [0], [0]]
    assert [s.copied for s in states] == [x.nbytes, 0, x.nbytes]
    for _ in range(2):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    h = model.blocks[0](x)
    kept = h.detach().clone()
    y = model.blocks[1](h * 1.0)
    assert torch.equal(h, kept)
    with torch.no_grad():
        torch.testing.assert_close(y, ref.blocks[1](ref.blocks[0](x)), rtol=1e-4, atol=1e-6)


def test_hugging_face_layers_are_linked():
    """BERT's encoder layers read the previous layer's hidden states in place."""
    pytest.importorskip("transformers")
    from tests.transforms.test_graph_layers_gpu import _bert, _graphed

    from gpushape.transforms._graph_replay import MARK

    model, ids = _bert()
    _graphed(model, ids)
    layers = model.bert.encoder.layer
    assert not layers[0].__dict__[MARK].linked
    assert all(0 in layers[i].__dict__[MARK].linked for i in (1, 2))
