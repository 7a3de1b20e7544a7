"""Whole-model FLOP counts against published figures and analytic formulas.

FLOPs are 2 x MACs; the figures below are MACs of the matmuls, convolutions and attention
(`gemm_flops / 2`), the usual way model sizes are quoted (norms, activations and adds excluded).
"""

from __future__ import annotations

import pytest
import torch
from _trace_helpers import ops_named, work

import gpushape
from gpushape.models import create_model
from gpushape.tracing import Trace


def _gmacs(name: str, **options) -> tuple[float, Trace]:
    model, inputs = create_model(name, batch=1, **options)
    t = gpushape.trace(model, inputs)
    return sum(work(op).gemm_flops for op in t.ops) / 2, t


def test_resnet50_is_4_09_gmacs():
    macs, _ = _gmacs("resnet50")  # 1 x 3 x 224 x 224, the torchvision figure
    assert macs == pytest.approx(4.09e9, rel=0.02)


def test_vit_b16_is_17_6_gmacs():
    macs, _ = _gmacs("vit-b16")  # 224 x 224, 196 patches + class token
    assert macs == pytest.approx(17.6e9, rel=0.03)


def _transformer_macs(layers, t, d, d_ff, vocab, *, causal, head_transform) -> float:
    """Per layer: Q, K, V and output projections T x 4d^2, the MLP T x 2 d d_ff, attention
    QK^T and PV 2 x pairs x d (pairs = T^2, or T(T+1)/2 causal); then the LM head T d V
    (BERT's MLM head first runs a d x d transform)."""
    pairs = t * (t + 1) / 2 if causal else t * t
    per_layer = t * (4 * d * d + 2 * d * d_ff) + 2 * pairs * d
    head = t * d * vocab + (t * d * d if head_transform else 0)
    return layers * per_layer + head


def test_bert_base_matches_its_formula():
    macs, _ = _gmacs("bert-base")  # seq 512, MLM head over the 30522-token vocabulary
    expected = _transformer_macs(12, 512, 768, 3072, 30522, causal=False, head_transform=True)
    assert macs == pytest.approx(expected, rel=0.02)


def test_gpt2_matches_its_formula():
    macs, _ = _gmacs("gpt2")  # seq 1024, causal, 50257-token vocabulary
    expected = _transformer_macs(12, 1024, 768, 4 * 768, 50257, causal=True, head_transform=False)
    assert macs == pytest.approx(expected, rel=0.02)


def test_llama_7b_forward_traces_on_meta():
    # 32 layers, d 4096, SwiGLU d_ff 11008 (three d x d_ff projections), causal, vocab 32000.
    macs, t = _gmacs("llama-7b", seq_len=2048)
    seq, d, d_ff = 2048, 4096, 11008
    per_layer = seq * (4 * d * d + 3 * d * d_ff) + 2 * (seq * (seq + 1) / 2) * d
    assert macs == pytest.approx(32 * per_layer + seq * d * 32000, rel=0.02)
    assert t.device == "meta" and len(ops_named(t, "_scaled_dot_product_flash_attention")) == 32


@pytest.mark.parametrize(
    "name,options",
    [
        ("resnet50", {}),
        ("bert-base", {"seq_len": 64, "layers": 2}),
    ],
)
def test_training_backward_is_twice_the_forward_per_linear_and_conv(name, options):
    model, inputs = create_model(name, batch=1, **options)
    t = gpushape.trace(model, inputs, train=True)
    checked, wgrad_only = 0, []
    for op in t.forward_ops():
        if op.name not in ("convolution", "addmm", "mm"):
            continue
        backward = t.backward_of(op.index)
        forward_flops = work(op).gemm_flops
        backward_flops = sum(work(b).gemm_flops for b in backward)
        # dgrad + wgrad, except where the layer's input needs no gradient (the image stem)
        input_grad = all(b.params.get("output_mask", (True,))[0] for b in backward)
        assert backward_flops == (2 if input_grad else 1) * forward_flops, (op.module, op.op)
        checked += 1
        if not input_grad:
            wgrad_only.append(op.module)
    assert checked >= (53 if name == "resnet50" else 14)
    assert wgrad_only == (["conv1"] if name == "resnet50" else [])


def test_tracing_does_not_allocate_the_weights():
    model, inputs = create_model("llama-7b", batch=1, seq_len=16, layers=2)
    assert all(p.device == torch.device("meta") for p in model.parameters())
    t = gpushape.trace(model, inputs, train=True)
    assert t.backward_ops() and all(p.device.type == "meta" for p in model.parameters())
