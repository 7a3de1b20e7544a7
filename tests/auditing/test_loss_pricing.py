"""A library LM's training step is audited with its loss (the audit passes labels): the
cross-entropy's kernels priced eager as traced, and under torch.compile as Inductor's two
fused kernels over the logits (pricing/loss.py)."""

from __future__ import annotations

import pytest
import torch

import gpushape
from gpushape.auditing.pricing.loss import COMPILED_PASSES, loss_chain
from gpushape.models import resolve_model

pytest.importorskip("transformers")

GPT2 = "hf:gpt2?n_layer=2&n_embd=256&n_head=4&vocab_size=8000&seq=256"


def _audit(spec: str, **kw):
    r = resolve_model(spec, batch=4)
    return r, gpushape.audit(r.model, r.example_inputs, gpu="h200", dtype=torch.bfloat16, **kw)


def test_a_training_audit_traces_the_models_own_loss_and_inference_does_not():
    r, _ = _audit(GPT2, train=True)
    train = gpushape.trace(r.model, r.example_inputs, train=True)
    assert not loss_chain(train)[0]  # the plain trace has no labels, so no loss
    from gpushape.models.labels import with_labels

    traced = gpushape.trace(r.model, with_labels(r.model, r.example_inputs), train=True)
    ops, elements, itemsize = loss_chain(traced)
    names = {o.name for o in ops}
    assert {"_log_softmax", "_log_softmax_backward_data", "nll_loss_forward"} <= names
    assert "_to_copy" in names  # GPT-2 casts its bf16 logits to float32 for the loss
    assert elements == 4 * 256 * 8000 and itemsize == 2  # every position's logits, in bf16
    _, with_loss = _audit(GPT2, train=True)
    _, forward = _audit(GPT2, train=False)
    assert with_loss.step.gpu_s > forward.step.gpu_s


def test_under_compile_the_loss_is_priced_as_inductors_fused_kernels(monkeypatch):
    from gpushape.auditing import inductor as modes  # where compile mode prices them
    from gpushape.hardware import calibrated
    from gpushape.models.labels import with_labels

    _, compiled = _audit(GPT2, train=True, mode="compile")
    monkeypatch.setattr(modes, "compiled_loss_saving_s", lambda ctx: 0.0)
    _, unfused = _audit(GPT2, train=True, mode="compile")
    r = resolve_model(GPT2, batch=4)
    traced = gpushape.trace(r.model, with_labels(r.model, r.example_inputs), train=True)
    ops, elements, itemsize = loss_chain(traced)
    spec = calibrated("h200")
    eager_loss = sum(gpushape.cost(traced, spec).ops[o.index].kernel_time_s for o in ops)
    rate = spec.attainable_bandwidth_bytes_per_s() * spec.achievable.memory("softmax")
    fused = COMPILED_PASSES * elements * itemsize / rate
    assert 0 < fused < eager_loss
    assert unfused.step.gpu_s - compiled.step.gpu_s == pytest.approx(eager_loss - fused, rel=0.02)


class TinyForCausalLM(torch.nn.Module):
    """A Hugging Face-shaped causal LM whose loss counts its labels on the host (`.item()`),
    which a meta trace cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.config = object()
        self.emb = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        if labels is None:
            return logits
        count = int((labels != -100).sum().item())
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()) / count


def test_a_loss_that_does_not_trace_leaves_the_step_without_it():
    ids = torch.zeros(2, 8, dtype=torch.long)
    report = gpushape.audit(TinyForCausalLM(), (ids,), gpu="h200", train=True)
    assert report.with_loss is False and report.step.gpu_s > 0
    from gpushape.auditing.report.header import header_text

    assert "own loss" not in header_text(report)


def test_the_header_says_the_step_has_the_models_loss():
    from gpushape.auditing.report.header import header_text

    _, report = _audit(GPT2, train=True)
    assert report.with_loss and "training step with the model's own loss" in header_text(report)
    _, forward = _audit(GPT2, train=False)
    assert not forward.with_loss and "own loss" not in header_text(forward)
