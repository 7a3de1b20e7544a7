"""Fixtures shared by the transforms' tests."""

import pytest
import torch

from gpushape.transforms import _graph_capture, graph_layers


@pytest.fixture
def fake_graphs(monkeypatch):
    """Capture without a GPU: the capture (_graph_capture.graphed_callables) returns the
    adapters as they are (their forward runs the layer eagerly), each counting its calls; the
    GPU-only checks pass."""
    calls = []

    def fake(callables, samples, **_):
        for c, s in zip(callables, samples):
            c(*s)  # the capture runs each layer once (it fills the output structure)

        def counted(c):
            original = c.forward

            def forward(*tensors):
                calls.append(c.layer)
                return original(*tensors)

            c.forward = forward
            return c

        return tuple(counted(c) for c in callables)

    monkeypatch.setattr(_graph_capture, "graphed_callables", fake)
    monkeypatch.setattr(graph_layers, "_why_not", lambda model, ctx: None)
    monkeypatch.setattr(graph_layers, "self_check", lambda model, inputs: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return calls
