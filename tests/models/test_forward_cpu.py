"""Real forwards on the CPU in float32, for tiny configs of every zoo architecture."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from gpushape.models import create_model, list_models
from gpushape.models.llama import LLAMA_TINY

# Per zoo entry: options for a tiny model of the same class, and the output shape at batch 2.
TINY_LM = dict(layers=2, hidden=32, heads=4, mlp_hidden=64, vocab_size=97, max_seq_len=24)
TINY = {
    "resnet50": (dict(blocks=(1, 1, 1, 1), width=8, num_classes=10, image_size=32), (2, 10)),
    "resnet50-gpu": (dict(blocks=(1, 1, 1, 1), width=8, num_classes=10, image_size=32), (2, 10)),
    "bert-base": ({**TINY_LM, "seq_len": 12}, (2, 12, 97)),
    "gpt2": ({**TINY_LM, "seq_len": 12}, (2, 12, 97)),
    "vit-b16": (
        dict(
            image_size=32, patch_size=8, hidden=32, layers=2, heads=4, mlp_hidden=64, num_classes=10
        ),
        (2, 10),
    ),
    "llama-7b": (dict(config=LLAMA_TINY, seq_len=12), (2, 12, LLAMA_TINY.vocab_size)),
}


def tiny(name: str, **extra):
    options, _ = TINY[name]
    return create_model(name, batch=2, dtype=torch.float32, device="cpu", **{**options, **extra})


@pytest.mark.parametrize("name", [e.name for e in list_models()])
def test_tiny_config_forward_on_cpu_is_finite_with_the_right_shape(name):
    assert name in TINY, f"add a tiny config for new zoo model {name!r} to TINY"
    torch.manual_seed(0)
    model, inputs = tiny(name)
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *inputs])
    model.eval()
    with torch.no_grad():
        out = model(*inputs)
    assert tuple(out.shape) == TINY[name][1]
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert out.std() > 0  # weights were initialised, not left at zero


@pytest.mark.parametrize("name", ["bert-base", "gpt2", "llama-7b"])
def test_token_ids_are_random_in_the_vocabulary(name):
    torch.manual_seed(0)
    model, (ids,) = tiny(name)
    vocab = model.config.vocab_size
    assert ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < vocab
    assert ids.unique().numel() > 1


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model, _ = tiny("gpt2", hidden=256, mlp_hidden=512, layers=8)
    wte_std = model.transformer.wte.weight.std().item()
    proj_std = model.transformer.h[0].mlp.c_proj.weight.std().item()
    assert abs(wte_std - 0.02) < 0.002
    assert abs(proj_std - 0.02 / 4) < 0.001  # 0.02 / sqrt(2 * 8 layers)


def test_resnet_batchnorm_starts_at_identity():
    model, _ = tiny("resnet50")
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(torch.equal(bn.weight, torch.ones_like(bn.weight)) for bn in bns)


class CallRecorder(TorchFunctionMode):
    """Which torch functions a forward calls (to tell the two attention forms apart)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("with_mask", [False, True])
def test_manual_attention_bert_equals_sdpa_bert_in_eval(with_mask):
    torch.manual_seed(0)
    sdpa, (ids,) = tiny("bert-base")
    manual, _ = tiny("bert-base", attention="manual")
    manual.load_state_dict(sdpa.state_dict())
    sdpa.eval()
    manual.eval()
    mask = None
    if with_mask:  # the second sequence is padded after 7 tokens
        mask = torch.ones_like(ids)
        mask[1, 7:] = 0
    with torch.no_grad():
        expected = sdpa(ids, attention_mask=mask)
        got = manual(ids, attention_mask=mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("attention", "sdpa_calls"), [("sdpa", 2), ("manual", 0)])
def test_bert_attention_forms_call_what_they_claim(attention, sdpa_calls):
    model, (ids,) = create_model("bert-base", batch=1, attention=attention, **TINY_LM, seq_len=8)
    with CallRecorder() as recorder, torch.no_grad():
        model(ids)
    assert recorder.names.count("scaled_dot_product_attention") == sdpa_calls  # one per layer
    assert (recorder.names.count("softmax") == 2) == (attention == "manual")


@pytest.mark.parametrize("name", ["gpt2", "llama-7b"])
def test_decoders_are_causal(name):
    torch.manual_seed(0)
    model, (ids,) = tiny(name)
    model.eval()
    changed = ids.clone()
    changed[:, 8] = (changed[:, 8] + 1) % model.config.vocab_size
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(after[:, :8], before[:, :8])  # the past ignores the future
    assert not torch.allclose(after[:, 8:], before[:, 8:])


def test_training_mode_dropout_changes_bert_outputs():
    torch.manual_seed(0)
    model, (ids,) = tiny("bert-base", attention="manual")
    with torch.no_grad():
        first, second = model(ids), model(ids)  # nn.Module default: training mode
    assert not torch.allclose(first, second)
