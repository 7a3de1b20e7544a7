"""launch-bound's fix costs memory: a whole-step graph keeps the step's activations in a pool
of its own, so a training step's finding says how much the peak grows, and warns where the
estimate passes what the chip holds."""

from __future__ import annotations

from gpushape.auditing import audit
from gpushape.hardware import get_gpu

from .cases import build, meta
from .models import ManyTiny


def _finding(gpu, train=True):
    model, inputs = build(ManyTiny), (meta(16, 64),)
    findings = audit(model, inputs, gpu=gpu, profile=None, train=train, rules=["launch-bound"])
    (f,) = findings.findings
    return f


def test_a_training_steps_finding_states_the_graphs_memory():
    f = _finding(get_gpu("h200"))
    pool = f.evidence["graph_pool_bytes"]
    assert 0 < pool < f.evidence["training_memory_bytes"]
    assert f"{pool / 1e9:,.1f} GB" in f.message
    assert "may not fit" not in f.message


def test_the_finding_warns_where_the_graphs_memory_would_not_fit():
    h200 = get_gpu("h200")
    f = _finding(h200)
    need = f.evidence["training_memory_bytes"] + f.evidence["graph_pool_bytes"]
    small = h200.replace(memory_bytes=int(need / 0.8) - 1)
    roomy = h200.replace(memory_bytes=int(need / 0.8) + 1024)
    assert "may not fit" in _finding(small).message
    assert "may not fit" not in _finding(roomy).message


def test_inference_has_no_graph_memory_note():
    f = _finding(get_gpu("h200"), train=False)
    assert "graph_pool_bytes" not in f.evidence
    assert "pool of its own" not in f.message
