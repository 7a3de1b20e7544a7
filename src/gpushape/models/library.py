"""Library models as MODEL: `hf:NAME` (Hugging Face transformers) and `timm:NAME`, built from
their configuration alone, on the meta device by default: nothing is downloaded, no weights.

    gpushape audit 'hf:llama?num_hidden_layers=2&hidden_size=256' --train   # quote the &
    gpushape audit hf:./config.json --batch 4
    gpushape audit timm:convnext_tiny

    from gpushape.models.library import hf_model, timm_model
    model, inputs = hf_model("llama", attn="eager", num_hidden_layers=2)

Spec: `PREFIX:NAME[?KEY=VALUE&KEY=VALUE...]`; values read as JSON where they parse (2, 0.1,
true, null), else as text.
- `hf:` NAME is a model type (`gpt2`, `bert`, `llama`: `AutoConfig.for_model`) or a local
  config.json, or the folder holding one (read as `AutoConfig.from_pretrained` would, with the
  overrides given to the config's constructor); a hub id is refused (no download). The model
  is the Auto class's `from_config` under `torch.device("meta")`; its head is the config's
  `architectures[0]` when it names one, else a masked-LM head where the type has one
  (BERT-likes), else a seq2seq LM (encoder-decoders: T5, Pegasus), else a speech seq2seq LM
  (Whisper), else a causal-LM head (decoders), else image classification, else the bare
  model. KEYs: `attn` (the attention implementation, default "sdpa", what transformers picks
  on CUDA, or "eager" for a model with no SDPA path, as transformers falls back; "eager" is
  the hand-written softmax(QK^T)V), `head` (masked-lm, seq2seq-lm, speech-seq2seq,
  causal-lm, image-classification, base), `seq` (sequence length); any other KEY overrides
  the config (`num_hidden_layers=2`), checked against the type's config.
  `use_cache` stays as the config has it (on for decoders: the KV cache a plain forward builds
  is part of the step; `use_cache=False` leaves it out, and the audit reads the position ids
  transformers then checks for packed sequences as one sequence a row: hf_masks.py).
- `timm:` NAME is a `timm.create_model` name, built with `pretrained=False`; KEYs: `attn`
  ("sdpa" sets every module's `fused_attn` on, "eager" off; default: as timm sets it, on where
  timm calls it tested, off where experimental, as in Swin, TIMM_FUSED_ATTN changing both), any
  other KEY a `create_model` keyword (`num_classes=10`).

Inputs: decoders batch 8 x 1024 token ids, other text models 16 x 512 (both capped at the
config's position limit), images batch 64 x the model's input size (timm's pretrained_cfg, or
`img_size`; transformers' `image_size`), speech batch 8 x 30 s of log-mel features (Whisper:
mel bins x twice the encoder's positions, with the decoder's tokens) or 5 s of 16 kHz samples
(wav2vec2). `--batch` replaces the batch, `--input` the inputs (a text model's `--input 4x128`
without a dtype is token ids, int64; a model whose main input is none of these needs
--input). Token ids are zeros, which
every vocabulary has. Floats are in `dtype`; transformers builds in it (keeping the buffers it
keeps in fp32), a timm model is cast.

A missing library is a `MissingLibraryError` (one line, exit 2 in the CLI) naming the pip extra.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError
from ._libraries import IMAGE_BATCH, _library, _one_line, timm_model
from ._libraries import MissingLibraryError as MissingLibraryError  # re-exported
from ._libraries import is_library_grn as is_library_grn  # re-exported
from ._libraries import is_library_group_norm as is_library_group_norm  # re-exported
from ._libraries import library_missing as library_missing  # re-exported
from .input_spec import make_input, parse_input_spec

PREFIXES = ("hf", "timm")
TEXT_DEFAULTS = {"decoder": (8, 1024), "encoder": (16, 512)}  # batch, sequence length
AUDIO_BATCH = 8  # log-mel features (Whisper: 30 s of them) or 5 s of 16 kHz samples
AUDIO_SAMPLES = 5 * 16_000
HF_HEADS = {  # --head: (Auto class, mapping of model type -> class name)
    "masked-lm": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "seq2seq-lm": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    "speech-seq2seq": ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    "causal-lm": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "image-classification": (
        "AutoModelForImageClassification",
        "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    ),
    "base": ("AutoModel", "MODEL_MAPPING_NAMES"),
}


def is_library_spec(spec: Any) -> bool:
    """Whether MODEL names a library model (`hf:...`, `timm:...`)."""
    prefix, sep, _ = str(spec).strip().partition(":")
    return bool(sep) and prefix.lower() in PREFIXES


def parse_library_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """'hf:llama?num_hidden_layers=2&attn=eager' -> ('hf', 'llama', {...}), values parsed."""
    prefix, _, rest = str(spec).strip().partition(":")
    name, _, query = rest.partition("?")
    if not name.strip():
        raise GpushapeError(f"bad model {spec!r}: expected {prefix}:NAME[?KEY=VALUE&...]")
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip().isidentifier():
            raise GpushapeError(f"bad option {item!r} in {spec!r}: expected KEY=VALUE")
        options[key.strip()] = _value(value.strip())
    return prefix.lower(), name.strip(), options


def _value(text: str) -> Any:
    """'2' -> 2, '0.1' -> 0.1, 'true'/'True' -> True, 'null'/'None' -> None, else the text."""
    words = {"true": True, "false": False, "none": None, "null": None}
    if text.lower() in words:
        return words[text.lower()]
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_library_model(
    spec: str,
    *,
    batch: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "meta",
    inputs: list[str] | None = None,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The resolver's hook: an `hf:`/`timm:` spec -> (model, example_inputs)."""
    library, name, options = parse_library_spec(spec)
    build = hf_model if library == "hf" else timm_model
    try:
        model, given = build(name, batch=batch, dtype=dtype, device=device, **options)
    except TypeError as exc:  # an option named twice (batch=), a seq that is not a number
        raise GpushapeError(f"{spec}: {_one_line(exc)}") from exc
    if not inputs:
        if given is None:
            raise GpushapeError(
                f"{spec}: {type(model).__name__} takes {model.main_input_name!r}, whose shape "
                f"gpushape cannot guess; give it with --input SHAPE[:DTYPE]"
            )
        return model, given
    ids = getattr(model, "main_input_name", None) == "input_ids"
    parsed = [parse_input_spec(s, torch.int64 if ids else dtype) for s in inputs]
    return model, tuple(make_input(shape, dt, torch.device(device)) for shape, dt in parsed)


# --- transformers ------------------------------------------------------------------------


def hf_model(
    name: str,
    *,
    batch: int | None = None,
    seq: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "meta",
    attn: str | None = None,
    head: str | None = None,
    **config: Any,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A transformers model from a model type or a local config.json, and example inputs
    (None for a main input other than token ids or pixels). `attn`: the attention
    implementation; by default "sdpa", as transformers picks on CUDA, or "eager" for a model
    class that has no SDPA path (as transformers falls back for it)."""
    transformers = _library("hf")
    device = torch.device(device)
    with _quiet(transformers):
        cfg = _hf_config(transformers, name, config)
    cls = _hf_class(transformers, name, cfg, head)
    model = _hf_build(transformers, name, cls, cfg, attn, dtype, device)
    _name_default_loss(transformers, model)
    return model, _hf_inputs(transformers, model, cfg, batch, seq, dtype, device)


def _name_default_loss(transformers: ModuleType, model: nn.Module) -> None:
    """GPT-2's GPT2LMHeadModel (no loss type in its class name) named the causal LM loss that
    transformers falls back to: the same step, without its "`loss_type=None`" warning."""
    mapping = getattr(getattr(transformers, "loss", None), "loss_utils", None)
    known = getattr(mapping, "LOSS_MAPPING", {})  # transformers < 4.46: no loss types
    if "ForCausalLM" in known and hasattr(model, "loss_type") and model.loss_type not in known:
        with contextlib.suppress(AttributeError):  # a read-only loss_type stays
            model.loss_type = "ForCausalLM"


def _hf_build(transformers, name, cls, cfg, attn, dtype, device) -> nn.Module:
    tried = attn or "sdpa"
    kwargs = {"attn_implementation": tried, _dtype_keyword(transformers): dtype}
    with _quiet(transformers), torch.device(device):
        try:
            return cls.from_config(cfg, **kwargs)
        except Exception as exc:
            no_sdpa = attn is None and "scaled_dot_product_attention" in str(exc)
            if not no_sdpa:
                raise GpushapeError(
                    f"hf:{name}: transformers could not build {_class_name(cls)} with "
                    f"attention {tried!r}: {_one_line(exc)}"
                ) from exc
        kwargs["attn_implementation"] = "eager"
        try:
            return cls.from_config(cfg, **kwargs)
        except Exception as exc:
            raise GpushapeError(
                f"hf:{name}: transformers could not build {_class_name(cls)} with attention "
                f"'sdpa' (it has no SDPA path) nor 'eager': {_one_line(exc)}"
            ) from exc


def _hf_config(transformers: ModuleType, name: str, overrides: dict[str, Any]) -> Any:
    """The config of a model type or a local config.json, overrides passed to its constructor
    (settings derived there, such as LLaMA's head_dim from hidden_size, follow them)."""
    path = Path(name).expanduser()
    if path.exists():
        raw = _read_config(name, path)
        model_type = _hf_type(transformers, str(raw.pop("model_type", "")), name)
    elif "/" in name or name.endswith(".json"):
        raise GpushapeError(
            f"hf:{name}: no such config file here; gpushape builds models from a "
            f"configuration and downloads nothing: save the model's config.json and give "
            f"hf:path/to/config.json, or a model type such as hf:llama"
        )
    else:
        raw, model_type = {}, _hf_type(transformers, name, name)
    config_class = transformers.CONFIG_MAPPING[model_type]
    _check_keys(f"hf:{name}", config_class(), overrides)
    try:
        return config_class.from_dict({**raw, **overrides})
    except Exception as exc:
        raise GpushapeError(f"hf:{name}: bad configuration: {_one_line(exc)}") from exc


def _read_config(name: str, path: Path) -> dict[str, Any]:
    """The JSON of a config.json, given as the file or the folder holding it."""
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise GpushapeError(f"hf:{name}: cannot read {file} as JSON: {_one_line(exc)}") from exc
    if not isinstance(raw, dict) or not raw.get("model_type"):
        raise GpushapeError(f"hf:{name}: {file} has no model_type; is it a transformers config?")
    return raw


def _hf_type(transformers: ModuleType, model_type: str, name: str) -> str:
    known = list(transformers.CONFIG_MAPPING.keys())
    if model_type in known:
        return model_type
    near = difflib.get_close_matches(model_type.lower(), known, n=4)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise GpushapeError(
        f"hf:{name}: transformers {transformers.__version__} has no model type "
        f"{model_type!r}{hint} (give a model type such as gpt2, bert or llama, or a path to a "
        f"config.json)"
    )


def _check_keys(label: str, default: Any, overrides: dict[str, Any]) -> None:
    """Every override names a setting of the config (transformers would keep a typo silently)."""
    known = set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
    unknown = [k for k in overrides if k not in known and not hasattr(default, k)]
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(known), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise GpushapeError(
            f"{label}: {type(default).__name__} has no setting {unknown[0]!r}{hint} "
            f"(options other than attn, head and seq set the config)"
        )


def _hf_class(transformers: ModuleType, name: str, cfg: Any, head: str | None) -> Any:
    """The model class: the head asked for, the config's architecture, or the type's default."""
    mapping = transformers.models.auto.modeling_auto
    if head is not None:
        if head not in HF_HEADS:
            raise GpushapeError(f"hf:{name}: unknown head {head!r}; use {', '.join(HF_HEADS)}")
        auto, names = HF_HEADS[head]
        if cfg.model_type not in getattr(mapping, names):
            raise GpushapeError(f"hf:{name}: model type {cfg.model_type!r} has no {head} head")
        return getattr(transformers, auto)
    for arch in getattr(cfg, "architectures", None) or []:
        if hasattr(transformers, arch):
            return _FromConfig(getattr(transformers, arch))
    for kind, (auto, names) in HF_HEADS.items():
        # an encoder-decoder's causal-LM class is its decoder alone (Pegasus): it would get
        # the encoder-decoder's inputs (the decoder's tokens as encoder states)
        if kind == "causal-lm" and getattr(cfg, "is_encoder_decoder", False):
            continue
        if cfg.model_type in getattr(mapping, names, {}):
            return getattr(transformers, auto)
    raise GpushapeError(f"hf:{name}: transformers has no model for type {cfg.model_type!r}")


class _FromConfig:
    """A concrete model class with the Auto classes' `from_config` call."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def from_config(self, cfg: Any, **kwargs: Any) -> nn.Module:
        return self.cls._from_config(cfg, **kwargs)


def _class_name(cls: Any) -> str:
    return getattr(cls, "cls", cls).__name__


def _dtype_keyword(transformers: ModuleType) -> str:
    """transformers 4.56 renamed `torch_dtype` to `dtype`."""
    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _hf_inputs(transformers, model, cfg, batch, seq, dtype, device):
    kind = getattr(model, "main_input_name", "input_ids")
    if kind == "pixel_values":
        size = getattr(cfg, "image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        shape = (batch or IMAGE_BATCH, getattr(cfg, "num_channels", 3), *size)
        return (make_input(shape, dtype, device),)
    if kind in ("input_features", "input_values"):
        return _audio_inputs(model, cfg, batch, seq, dtype, device)
    if kind != "input_ids":
        return None  # another input: the caller gives it
    causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    default_batch, default_seq = TEXT_DEFAULTS[
        "decoder" if type(model).__name__ in causal else "encoder"
    ]
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    seq = seq or (min(default_seq, limit) if limit else default_seq)
    ids = make_input((batch or default_batch, seq), torch.int64, device)
    if getattr(cfg, "is_encoder_decoder", False):  # T5, BART: the decoder's tokens too
        decoder = make_input((batch or default_batch, seq), torch.int64, device)
        return (ids, None, decoder)  # forward(input_ids, attention_mask, decoder_input_ids)
    return (ids,)


def _audio_inputs(model, cfg, batch, seq, dtype, device):
    """Log-mel features shaped as Whisper's encoder takes them (mel bins x twice its source
    positions: 30 s), or raw 16 kHz samples (wav2vec2, HuBERT); an encoder-decoder's decoder
    gets token ids too, `seq` of them (default: its position limit, at most 448)."""
    batch = batch or AUDIO_BATCH
    if getattr(model, "main_input_name", "") == "input_values":
        return (make_input((batch, AUDIO_SAMPLES), dtype, device),)
    mels, frames = getattr(cfg, "num_mel_bins", None), getattr(cfg, "max_source_positions", None)
    if not mels or not frames:
        return None  # features of another layout: the caller gives them
    features = make_input((batch, mels, 2 * frames), dtype, device)
    if not getattr(cfg, "is_encoder_decoder", False):
        return (features,)
    seq = seq or min(getattr(cfg, "max_target_positions", 448) or 448, 448)
    return (features, None, make_input((batch, seq), torch.int64, device))


@contextlib.contextmanager
def _quiet(transformers: ModuleType) -> Iterator[None]:
    """transformers' warnings off while it builds (deprecations, untrained heads)."""
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
