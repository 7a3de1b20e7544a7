"""graph-layers' capture on the CPU (the stand-in capture, conftest.py's `fake_graphs`): a capture
whose check fails is retried once, then refused, and either way its graphs are freed; revert
frees them too; inside the graphs, 16-bit Linear bias gradients are taken by a GEMV."""

import torch
from tests.transforms.test_graph_layers import Net, _apply

from gpushape.transforms import _core, _graph_capture, graph_layers


def test_a_failed_check_refuses_and_frees_the_graphs(fake_graphs, monkeypatch):
    """The refusal drops what the capture made (the stand-in's forward closes over its adapter,
    a cycle), so no graph outlives it; revert frees them too."""
    import weakref

    adapters = []
    capture = _graph_capture.graphed_callables

    def kept(callables, samples, **kw):
        out = capture(callables, samples, **kw)
        adapters.extend(weakref.ref(c) for c in out)
        return out

    monkeypatch.setattr(_graph_capture, "graphed_callables", kept)
    monkeypatch.setattr(graph_layers, "self_check", lambda m, i: "output 0 differs (max error 1)")
    model, x = Net().train(), torch.randn(2, 16)
    out = _apply(model, x)
    assert not out.changes and "max error 1" in out.refusals[0].reason
    assert adapters and all(ref() is None for ref in adapters)
    assert not any(graph_layers.is_graphed(b) for b in model.layers)
    monkeypatch.setattr(graph_layers, "self_check", lambda m, i: None)
    adapters.clear()
    _core.undo(_apply(model, x).changes)
    assert adapters and all(ref() is None for ref in adapters)


def test_a_check_that_fails_once_is_retried_on_a_fresh_capture(fake_graphs, monkeypatch):
    import weakref

    adapters, verdicts, links = [], iter(["output 0 differs (max error 1)", None]), []
    capture = _graph_capture.graphed_callables

    def kept(callables, samples, **kw):
        out = capture(callables, samples, **kw)
        adapters.append([weakref.ref(c) for c in out])
        links.append(kw.get("links"))
        return out

    monkeypatch.setattr(_graph_capture, "graphed_callables", kept)
    monkeypatch.setattr(graph_layers, "self_check", lambda m, i: next(verdicts))
    model, x = Net().train(), torch.randn(2, 16)
    out = _apply(model, x)
    assert len(out.changes) == 3 and not out.refusals and len(adapters) == 2
    # the first capture reads each layer's input in place, the second copies them all
    assert links == [{(1, 0): (0, 0), (2, 0): (1, 0)}, {}]
    assert all(ref() is None for ref in adapters[0])  # the first capture's graphs are gone
    assert all(ref() is not None for ref in adapters[1])
    monkeypatch.setattr(graph_layers, "self_check", lambda m, i: "still differs")
    _core.undo(out.changes)
    refused = _apply(model, x).refusals
    assert "still differs; a first capture too: still differs" in refused[0].reason


def test_the_graphs_take_16_bit_bias_gradients_by_a_gemv(fake_graphs, monkeypatch):
    from gpushape.transforms import _bias_grad

    monkeypatch.setattr(_bias_grad, "MIN_ROWS", 4)
    model, x = Net().to(torch.bfloat16).train(), torch.randn(8, 16, dtype=torch.bfloat16)
    changes = _apply(model, x).changes
    assert len(changes) == 3 and all("1 Linear bias gradient(s) by a cuBLAS GEMV" in c.detail
                                     for c in changes)  # fmt: skip
    model32 = Net().train()
    assert not any("GEMV" in c.detail for c in _apply(model32, torch.randn(8, 16)).changes)


def test_the_check_says_by_how_much_a_tensor_misses():
    from gpushape.transforms._graph_check import _mismatch

    ref = torch.tensor([1.0, -4.0], dtype=torch.bfloat16)
    assert _mismatch(ref + 0.01, ref) is None  # within 2% of the scale (4)
    assert _mismatch(ref + 0.5, ref) == "max error 0.5, allowed 0.02 of its scale 4"
    assert _mismatch(None, None) is None and _mismatch(ref, None) == "one of the two is None"
    assert _mismatch(ref[:1], ref) == "shape (1,) against (2,)"
    assert _mismatch(ref * 0, ref * 0, floor=1.0) is None
