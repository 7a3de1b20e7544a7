"""The zoo on the meta device: every entry builds without memory; sizes match the architectures."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpushape.errors import GpushapeError
from gpushape.models import (
    ModelEntry,
    create_model,
    get_model_entry,
    list_models,
    register_model,
)

ZOO = [entry.name for entry in list_models()]


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def all_tensors(model, inputs):
    return [*model.parameters(), *model.buffers(), *inputs]


@pytest.mark.parametrize("name", ZOO)
def test_every_model_builds_on_meta_with_module_and_tensor_tuple(name):
    entry = get_model_entry(name)
    model, inputs = entry.factory()
    assert isinstance(model, torch.nn.Module)
    assert isinstance(inputs, tuple) and inputs
    assert all(isinstance(t, torch.Tensor) for t in inputs)
    assert all(t.is_meta for t in all_tensors(model, inputs))  # nothing allocated
    assert all(t.shape[0] == entry.default_batch for t in inputs)


@pytest.mark.parametrize("name", ZOO)
def test_every_model_puts_floats_in_the_requested_dtype(name):
    model, inputs = create_model(name, batch=2, dtype=torch.float16)
    for t in all_tensors(model, inputs):
        assert t.dtype in (torch.float16, torch.int64), t.dtype  # token ids and BN counters


@pytest.mark.parametrize("name", ZOO)
def test_every_model_has_a_description_and_a_forward_on_meta(name):
    entry = get_model_entry(name)
    assert entry.description and entry.default_batch >= 1
    model, inputs = create_model(name, batch=1)
    with torch.no_grad():
        out = model(*inputs)
    assert out.is_meta and out.shape[0] == 1


@pytest.mark.parametrize("name", ZOO)
def test_every_factory_shows_the_common_signature(name):
    params = list(inspect.signature(get_model_entry(name).factory).parameters.values())
    assert [(p.name, p.default) for p in params[:3]] == [
        ("batch", None),
        ("dtype", torch.bfloat16),
        ("device", "meta"),
    ]


def test_list_models_is_sorted_entries_with_the_issue_defaults():
    entries = list_models()
    assert all(isinstance(e, ModelEntry) for e in entries)
    assert [e.name for e in entries] == sorted(e.name for e in entries)
    defaults = {e.name: e.default_batch for e in entries}
    assert {
        "resnet50": 32,
        "bert-base": 8,
        "gpt2": 8,
        "vit-b16": 32,
        "llama-7b": 1,
    }.items() <= defaults.items()


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [
        ("resnet50", (32, 3, 224, 224)),
        ("bert-base", (8, 512)),
        ("gpt2", (8, 1024)),
        ("vit-b16", (32, 3, 224, 224)),
        ("llama-7b", (1, 2048)),
    ],
)
def test_default_example_inputs(name, input_shape):
    _, (x,) = create_model(name)
    assert tuple(x.shape) == input_shape
    assert x.dtype == (torch.bfloat16 if len(input_shape) == 4 else torch.int64)


def test_seq_len_overrides_the_default_length():
    _, (ids,) = create_model("gpt2", batch=3, seq_len=77)
    assert tuple(ids.shape) == (3, 77)


def test_resnet50_parameter_count():
    model, _ = create_model("resnet50")
    assert n_params(model) == 25_557_032


def test_bert_base_mlm_parameter_count():
    model, _ = create_model("bert-base")
    V, C, F, L, P = 30522, 768, 3072, 12, 512
    ln = 2 * C
    embeddings = V * C + P * C + 2 * C + ln  # word, position, token type, LayerNorm
    layer = 4 * (C * C + C) + ln + (C * F + F) + (F * C + C) + ln  # q k v o, LN, FFN, LN
    mlm_head = (C * C + C) + ln + V  # transform dense, LayerNorm, output bias; decoder tied
    assert n_params(model) == embeddings + L * layer + mlm_head == 109_514_298


def test_bert_decoder_is_tied_to_word_embeddings():
    model, _ = create_model("bert-base", dtype=torch.float16)
    head = model.cls.predictions
    assert head.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert head.decoder.bias is head.bias


def test_gpt2_parameter_count_with_tied_head():
    model, _ = create_model("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert n_params(model) == 124_439_808


def test_vit_b16_parameter_count():
    model, _ = create_model("vit-b16")
    assert n_params(model) == 86_567_656


def test_llama_7b_counts_its_parameters_on_meta_without_allocating():
    model, (ids,) = create_model("llama-7b")
    params = list(model.parameters())
    assert all(p.is_meta for p in params) and ids.is_meta
    assert sum(p.numel() for p in params) == 6_738_415_616
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # LLaMA does not tie
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))


def torchvision_resnet50_keys() -> list[str]:
    """torchvision's ResNet-50 state_dict keys, in order, written from the architecture."""

    def bn(prefix: str) -> list[str]:
        return [
            f"{prefix}.{s}"
            for s in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        ]

    keys = ["conv1.weight", *bn("bn1")]
    for stage, blocks in enumerate((3, 4, 6, 3), start=1):
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            for i in (1, 2, 3):
                keys += [f"{prefix}.conv{i}.weight", *bn(f"{prefix}.bn{i}")]
            if block == 0:  # every stage's first block projects the shortcut
                keys += [f"{prefix}.downsample.0.weight", *bn(f"{prefix}.downsample.1")]
    return [*keys, "fc.weight", "fc.bias"]


def test_resnet50_state_dict_keys_match_torchvision():
    model, _ = create_model("resnet50")
    assert list(model.state_dict()) == torchvision_resnet50_keys()


def test_resnet50_is_v1_5_with_the_stride_on_the_3x3_conv():
    model, _ = create_model("resnet50")
    for stage in (2, 3, 4):
        block = getattr(model, f"layer{stage}")[0]
        assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)
        assert block.downsample[0].stride == (2, 2)
    assert tuple(model.layer1[0].conv2.weight.shape) == (64, 64, 3, 3)
    assert tuple(model.fc.weight.shape) == (1000, 2048)


def forward_gmacs(name: str) -> float:
    model, inputs = create_model(name, batch=1)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*inputs)
    return counter.get_total_flops() / 2 / 1e9  # FLOPs = 2 x MACs


def test_resnet50_forward_is_4_09_gmacs():
    assert round(forward_gmacs("resnet50"), 2) == 4.09


def test_resnet50_gpu_is_the_guides_stem_and_wider_3x3s_at_1_93x_the_macs():
    model, (x,) = create_model("resnet50-gpu", batch=2)
    assert tuple(x.shape) == (2, 3, 224, 224)  # the image as given; the model pads it
    assert tuple(model.conv1.weight.shape) == (64, 32, 7, 7)
    block = model.layer1[0]
    assert tuple(block.conv2.weight.shape) == (128, 64, 3, 3)
    assert tuple(block.conv3.weight.shape) == (256, 128, 1, 1)
    assert tuple(model.layer4[2].conv2.weight.shape) == (1024, 512, 3, 3)
    assert n_params(model) == 42_002_664
    gmacs = forward_gmacs("resnet50-gpu")
    assert round(gmacs, 2) == 7.90 and round(gmacs / forward_gmacs("resnet50"), 2) == 1.93


def test_resnet50_gpu_pads_the_image_with_zero_channels():
    model, _ = create_model("resnet50-gpu", batch=1, dtype=torch.float32, device="cpu")
    model.eval()
    x = torch.randn(1, 3, 64, 64)
    seen = []
    model.conv1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
    assert seen[0].shape == (1, 32, 64, 64)
    assert torch.equal(seen[0][:, :3], x) and not seen[0][:, 3:].any()


@pytest.mark.parametrize("options", [dict(stem_in=2), dict(mid=0)])
def test_resnet_rejects_a_stem_under_three_channels_or_no_3x3_width(options):
    with pytest.raises(GpushapeError, match="stem_in must be at least 3 and mid at least 1"):
        create_model("resnet50", **options)


def test_vit_b16_forward_is_17_6_gmacs():
    assert round(forward_gmacs("vit-b16"), 1) == 17.6


# --- errors ----------------------------------------------------------------------------------


def test_unknown_model_lists_known_names_and_suggests_one():
    with pytest.raises(GpushapeError) as info:
        create_model("resnet5")
    message = str(info.value)
    assert message.startswith("unknown model 'resnet5' (did you mean resnet50?); known: ")
    assert "bert-base, gpt2, llama-7b, resnet50, resnet50-gpu, vit-b16" in message


def test_unknown_model_without_a_near_name_has_no_suggestion():
    with pytest.raises(GpushapeError, match=r"^unknown model 'qqqq'; known: bert-base, gpt2"):
        create_model("qqqq")


def test_names_are_case_and_separator_insensitive():
    assert get_model_entry("ResNet50").name == "resnet50"
    assert get_model_entry("vit_b16").name == "vit-b16"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": 0}, "batch must be a positive integer, got 0"),
        ({"batch": 2.5}, "batch must be a positive integer, got 2.5"),
        ({"dtype": torch.int64}, "dtype must be a floating-point torch.dtype"),
        ({"seq_len": 1025}, "gpt2: seq_len must be an integer in 1..1024, got 1025"),
        ({"nope": 1}, "gpt2: unknown option 'nope'; options: "),
        ({"heads": 5}, "gpt2: 5 heads do not divide the width 768"),
        ({"config": {"layers": 2}}, "gpt2: config must be a GPT2Config, got dict"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, message):
    with pytest.raises(GpushapeError) as info:
        create_model("gpt2", **kwargs)
    assert message in str(info.value)


def test_bert_rejects_an_unknown_attention_form():
    with pytest.raises(GpushapeError, match="attention must be 'sdpa' or 'manual', got 'flash'"):
        create_model("bert-base", attention="flash")


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register_model("gpt2", default_batch=1, description="again")(lambda **kw: None)
