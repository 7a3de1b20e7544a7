"""Library models as MODEL (`hf:`, `timm:`): spec parsing, configuration overrides, heads,
default and --input inputs, attention switches, and every error as one line."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

import gpushape
from gpushape.errors import GpushapeError
from gpushape.models import _libraries, resolve_model
from gpushape.models.library import (
    MissingLibraryError,
    is_library_spec,
    parse_library_spec,
)

SMALL_LLAMA = (
    "num_hidden_layers=2&hidden_size=256&num_attention_heads=4&num_key_value_heads=2"
    "&vocab_size=1000&intermediate_size=512"
)
SMALL_BERT = (
    "num_hidden_layers=1&hidden_size=128&num_attention_heads=2&intermediate_size=256"
    "&vocab_size=1000"
)


def error_of(spec: str, **kwargs) -> str:
    with pytest.raises(GpushapeError) as info:
        resolve_model(spec, **kwargs)
    message = str(info.value)
    assert "\n" not in message  # the CLI prints one line
    return message


def _timm():
    """timm, or a skip: it needs a torchvision that imports with the installed torch."""
    try:
        import timm
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        pytest.skip(f"timm does not import here: {type(exc).__name__}: {exc}")
    return timm


# --- parsing (no library needed) -------------------------------------------------------------


def test_specs_are_recognised_by_prefix():
    assert is_library_spec("hf:gpt2") and is_library_spec(" TIMM:resnet50 ")
    assert not is_library_spec("resnet50") and not is_library_spec("my_models.py:make")


def test_options_are_parsed_as_json_where_they_can_be():
    spec = "hf:llama?num_hidden_layers=2&rope_theta=1e4&tie_word_embeddings=True&attn=eager"
    library, name, options = parse_library_spec(spec + "&pad_token_id=null&act=silu")
    assert (library, name) == ("hf", "llama")
    assert options == {
        "num_hidden_layers": 2,
        "rope_theta": 1e4,
        "tie_word_embeddings": True,
        "attn": "eager",
        "pad_token_id": None,
        "act": "silu",
    }


@pytest.mark.parametrize("spec", ["hf:", "hf:?attn=eager", "hf:gpt2?n_layer", "hf:gpt2?2=3"])
def test_malformed_specs_are_one_line_errors(spec):
    assert "expected" in error_of(spec)


@pytest.mark.parametrize("prefix,extra", [("hf", "transformers"), ("timm", "timm")])
def test_a_missing_library_names_the_pip_extra(monkeypatch, prefix, extra):
    monkeypatch.setitem(sys.modules, extra, None)  # import of it fails with ImportError
    with pytest.raises(MissingLibraryError) as info:
        resolve_model(f"{prefix}:anything")
    assert str(info.value) == f"{prefix}: models need {extra}: pip install 'gpushape[{prefix}]'"


# --- transformers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def test_decoder_gets_a_causal_lm_head_and_token_ids(transformers):
    r = resolve_model(f"hf:llama?{SMALL_LLAMA}")
    assert type(r.model).__name__ == "LlamaForCausalLM"
    assert r.model.config._attn_implementation == "sdpa"  # what transformers picks on CUDA
    (ids,) = r.example_inputs
    assert ids.shape == (8, 1024) and ids.dtype == torch.int64 and ids.is_meta
    assert all(p.is_meta for p in r.model.parameters())
    assert r.model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_gpt2_names_the_loss_transformers_falls_back_to(transformers):
    """GPT2LMHeadModel's class name tells transformers no loss type: it falls back to the
    causal LM loss with a warning the user cannot act on. The built model names that loss, so
    the step is the same and the warning goes; a model with its own loss type keeps it."""
    gpt2 = resolve_model("hf:gpt2?n_layer=1").model
    assert gpt2.loss_type == "ForCausalLM"
    bert = resolve_model(f"hf:bert?{SMALL_BERT}").model
    assert bert.loss_type == "ForMaskedLM"


def test_config_overrides_reach_the_constructor(transformers):
    """LLaMA derives head_dim from hidden_size in its config's constructor."""
    r = resolve_model(f"hf:llama?{SMALL_LLAMA}")
    assert r.model.config.head_dim == 64 and len(r.model.model.layers) == 2
    assert r.model.model.layers[0].self_attn.k_proj.out_features == 2 * 64


def test_encoder_gets_a_masked_lm_head_and_512_tokens(transformers):
    r = resolve_model(f"hf:bert?{SMALL_BERT}", batch=3)
    assert type(r.model).__name__ == "BertForMaskedLM"
    assert r.example_inputs[0].shape == (3, 512)


def test_sequence_length_is_capped_by_the_position_limit(transformers):
    r = resolve_model(f"hf:bert?{SMALL_BERT}&max_position_embeddings=128")
    assert r.example_inputs[0].shape == (16, 128)
    r = resolve_model(f"hf:bert?{SMALL_BERT}&seq=64")
    assert r.example_inputs[0].shape == (16, 64)


def test_input_option_without_a_dtype_is_token_ids(transformers):
    r = resolve_model("hf:gpt2?n_layer=1&n_embd=64&n_head=2", inputs=["2x32"])
    assert r.example_inputs[0].shape == (2, 32) and r.example_inputs[0].dtype == torch.int64


def test_attention_implementation_and_head_can_be_chosen(transformers):
    r = resolve_model(f"hf:bert?{SMALL_BERT}&attn=eager&head=base")
    assert type(r.model).__name__ == "BertModel"
    assert r.model.config._attn_implementation == "eager"


def test_vision_type_gets_an_image_head_and_a_pixel_batch(transformers):
    r = resolve_model("hf:vit?num_hidden_layers=1&hidden_size=64&num_attention_heads=2", batch=2)
    assert type(r.model).__name__ == "ViTForImageClassification"
    assert r.example_inputs[0].shape == (2, 3, 224, 224)
    assert r.example_inputs[0].dtype == torch.bfloat16


def test_an_input_gpushape_cannot_guess_needs_the_input_option(transformers):
    spec = "hf:patchtst?num_hidden_layers=1"  # a time series: past_values
    assert "give it with --input" in error_of(spec)
    r = resolve_model(spec, inputs=["2x512x7"])
    assert r.example_inputs[0].shape == (2, 512, 7)
    assert r.example_inputs[0].dtype == torch.bfloat16  # values, not token ids


def test_config_json_builds_its_architecture(transformers, tmp_path):
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=500)
    config.architectures = ["GPT2LMHeadModel"]
    config.save_pretrained(tmp_path)
    for spec in (f"hf:{tmp_path}", f"hf:{tmp_path / 'config.json'}"):
        r = resolve_model(f"{spec}?n_layer=2")
        assert type(r.model).__name__ == "GPT2LMHeadModel" and len(r.model.transformer.h) == 2


def test_hf_errors_are_one_line(transformers, tmp_path):
    assert "did you mean llama" in error_of("hf:lama")
    assert "downloads nothing" in error_of("hf:meta-llama/Llama-2-7b-hf")
    assert "did you mean num_hidden_layers" in error_of("hf:llama?num_hidden_layer=2")
    assert "unknown head" in error_of("hf:gpt2?head=decoder")
    assert "no masked-lm head" in error_of("hf:llama?head=masked-lm")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert "no model_type" in error_of(f"hf:{tmp_path}")
    assert "could not build" in error_of("hf:gpt2?n_layer=1&attn=no_such_attention")


# --- timm --------------------------------------------------------------------------------


def test_timm_model_and_its_image_batch():
    _timm()
    r = resolve_model("timm:resnet18")
    assert r.example_inputs[0].shape == (64, 3, 224, 224)
    assert r.example_inputs[0].dtype == torch.bfloat16 and r.example_inputs[0].is_meta
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in r.model.parameters())


def test_timm_options_reach_create_model_and_the_input_size():
    _timm()
    r = resolve_model("timm:vit_tiny_patch16_224?img_size=96&depth=1&attn=eager", batch=2)
    assert r.example_inputs[0].shape == (2, 3, 96, 96) and len(r.model.blocks) == 1
    assert r.model.blocks[0].attn.fused_attn is False


def test_timm_errors_are_one_line():
    _timm()
    assert "did you mean resnet50" in error_of("timm:resnet5O")
    assert "attn=" in error_of("timm:resnet18?attn=flash")


def _needing_values(timm, monkeypatch, exc=None):
    """timm.create_model made to compute with a tensor's values first, as some releases'
    RegNet does (torch.unique of its width schedule), or to raise `exc` on meta."""
    create = timm.create_model

    def create_model(*args, **kwargs):
        if torch.empty(0).is_meta:
            if exc is not None:
                raise exc
            torch.arange(4).unique()  # no meta kernel: NotImplementedError
        return create(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", create_model)


def test_a_timm_model_that_reads_values_while_built_is_built_on_the_cpu(monkeypatch):
    _needing_values(_timm(), monkeypatch)
    r = resolve_model("timm:resnet18", batch=2)
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in r.model.parameters())
    assert all(b.is_meta for b in r.model.buffers()) and r.example_inputs[0].is_meta


def test_a_timm_failure_that_is_not_the_meta_devices_stays_one_line(monkeypatch):
    _needing_values(_timm(), monkeypatch, exc=ValueError("depth must be positive"))
    assert error_of("timm:resnet18") == (
        "timm:resnet18: timm.create_model failed: ValueError: depth must be positive"
    )


@pytest.mark.parametrize(
    "failure,expected",
    [
        (
            ModuleNotFoundError("No module named 'torchvision'", name="torchvision"),
            "timm: models need timm and torchvision: pip install 'gpushape[timm]'",
        ),
        (
            RuntimeError("operator torchvision::nms does not exist"),
            "timm: models need timm importable with this torch (RuntimeError: operator "
            "torchvision::nms does not exist): pip install 'gpushape[timm]'",
        ),
    ],
)
def test_a_library_whose_dependency_fails_says_which(monkeypatch, failure, expected):
    def import_module(name):
        raise failure

    monkeypatch.setattr(_libraries, "importlib", SimpleNamespace(import_module=import_module))
    assert error_of("timm:resnet18") == expected


def test_a_model_with_no_sdpa_path_is_built_eager_as_transformers_falls_back(transformers):
    r = resolve_model("hf:bloom?n_layer=1&hidden_size=64&n_head=4&vocab_size=256")
    assert r.model.config._attn_implementation == "eager"
    with pytest.raises(GpushapeError, match=r"could not build .* with attention 'sdpa'"):
        resolve_model("hf:bloom?n_layer=1&hidden_size=64&n_head=4&vocab_size=256&attn=sdpa")


def test_an_encoder_decoder_gets_the_decoders_tokens_too(transformers):
    r = resolve_model("hf:t5?num_layers=1&d_model=64&d_ff=128&num_heads=4&vocab_size=256")
    ids, mask, decoder = r.example_inputs
    assert mask is None and decoder.shape == ids.shape and decoder.dtype == torch.int64
    trace = gpushape.trace(r.model, r.example_inputs, train=True)
    assert any(rec.module.startswith("decoder.") for rec in trace.ops)


def test_deberta_v2_traces_on_meta(transformers):
    """DeBERTa-v2 checks its input ids for padding with `in`, which meta tensors cannot
    answer; the trace reads it as absent and the model audits without weights."""
    import gpushape

    r = resolve_model("hf:deberta-v2?num_hidden_layers=1&hidden_size=64&num_attention_heads=2"
                      "&intermediate_size=128&vocab_size=1000", batch=2)  # fmt: skip
    t = gpushape.trace(r.model, r.example_inputs, train=True)
    assert t.device == "meta" and t.ops


def test_encoder_decoders_build_their_seq2seq_class_and_trace_on_meta(transformers):
    """Pegasus's causal-LM class is its decoder alone, which the encoder-decoder's inputs do
    not fit: encoder-decoders get their seq2seq class. BART's decoder asks whether its padding
    mask is all true, which a meta tensor cannot answer: the audit takes the mask it built
    from none as all true."""
    import gpushape

    small = (
        "encoder_layers=1&decoder_layers=1&d_model=64&encoder_attention_heads=2"
        "&decoder_attention_heads=2&encoder_ffn_dim=128&decoder_ffn_dim=128&vocab_size=512"
    )
    for kind in ("pegasus", "bart"):
        r = resolve_model(f"hf:{kind}?{small}", batch=2)
        assert type(r.model).__name__.endswith("ForConditionalGeneration")
        report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True)
        assert report.totals.roofline_time_s > 0


def test_a_decoder_without_a_cache_audits_on_meta(transformers):
    """With use_cache=False and no padding mask transformers checks the position ids for
    packed sequences, a value meta tensors do not have: the audit reads them as one sequence
    a row (what the model's own positions are) and still traces the check's ops; the step
    then has no cache copying keys and values."""
    import gpushape
    from gpushape.models.hf_masks import meta_padding_masks

    small = "n_layer=1&n_embd=64&n_head=2&vocab_size=512&n_positions=64"
    r = resolve_model(f"hf:gpt2?{small}&use_cache=False", batch=2)
    with pytest.raises(GpushapeError, match="meta"):
        gpushape.trace(r.model, r.example_inputs, train=True)
    ops = {}
    for cache in (True, False):
        r = resolve_model(f"hf:gpt2?{small}&use_cache={cache}", batch=2)
        with meta_padding_masks(r.model):
            ops[cache] = [rec.name for rec in gpushape.trace(r.model, r.example_inputs).ops]
        report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True)
        assert report.totals.roofline_time_s > 0
    assert "cumsum" in ops[False] and "cumsum" not in ops[True]
    assert ops[False].count("cat") < ops[True].count("cat")


def test_speech_models_get_their_audio_inputs(transformers):
    """Whisper: its speech seq2seq head, 30 s of log-mel features (mel bins x twice the
    encoder's positions) and the decoder's tokens, and it audits on meta; wav2vec2: 5 s of
    16 kHz samples. `--batch` replaces the batch of each."""
    import gpushape

    small = "encoder_layers=1&decoder_layers=1&d_model=64&encoder_attention_heads=2" \
        "&decoder_attention_heads=2&encoder_ffn_dim=128&decoder_ffn_dim=128"  # fmt: skip
    r = resolve_model(f"hf:whisper?{small}", batch=2)
    assert type(r.model).__name__ == "WhisperForConditionalGeneration"
    features, mask, decoder = r.example_inputs
    assert tuple(features.shape) == (2, 80, 3000) and features.is_floating_point()
    assert mask is None and tuple(decoder.shape) == (2, 448)
    report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True)
    assert report.totals.roofline_time_s > 0
    r = resolve_model("hf:wav2vec2?num_hidden_layers=1", batch=3)
    assert [tuple(x.shape) for x in r.example_inputs] == [(3, 80_000)]
