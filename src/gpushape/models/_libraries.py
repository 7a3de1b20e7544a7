"""The optional libraries behind `hf:` and `timm:` models: importing them, or a one-line
`MissingLibraryError` naming the pip extra; and `timm:` models' builder (models/library.py
builds `hf:` ones): no pretrained weights, an image batch at the model's configured size."""

from __future__ import annotations

import difflib
import importlib
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError, meta_only
from .input_spec import make_input

_INSTALL = {"hf": "transformers", "timm": "timm"}
IMAGE_BATCH = 64


class MissingLibraryError(GpushapeError, ImportError):
    """hf: or timm: asked for, and the library is not importable."""


def _library(prefix: str) -> ModuleType:
    """The library behind a prefix, or a one-line MissingLibraryError naming the pip extra."""
    module = _INSTALL[prefix]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        need = module if missing == module else f"{module} and {missing}"
        cause = exc
    except Exception as exc:  # a library that fails while importing (a broken torchvision)
        need = f"{module} importable with this torch ({type(exc).__name__}: {_first(exc)})"
        cause = exc
    raise MissingLibraryError(
        f"{prefix}: models need {need}: pip install 'gpushape[{prefix}]'"
    ) from cause


def library_missing(spec: str) -> str | None:
    """None where the library behind `spec` (hf:..., timm:...) imports, else why not."""
    try:
        _library(str(spec).partition(":")[0])
    except MissingLibraryError as exc:
        return str(exc)
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


def _first(exc: BaseException, limit: int = 120) -> str:
    text = _one_line(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def timm_model(
    name: str,
    *,
    batch: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "meta",
    attn: str | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A timm model built without pretrained weights, and an image batch for it."""
    timm = _library("timm")
    device = torch.device(device)
    if attn not in (None, "sdpa", "eager"):
        raise GpushapeError(f"timm:{name}: attn={attn!r}; use sdpa or eager")
    try:
        with torch.device(device):
            model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as exc:
        if device.type != "meta" or not meta_only(exc):
            raise GpushapeError(_timm_failure(timm, name, exc)) from exc
        # its constructor computes with tensors whose values meta has none of (some timm
        # releases' RegNet width schedule calls torch.unique): built on the CPU, then moved
        try:
            with torch.device("cpu"):
                model = timm.create_model(name, pretrained=False, **kwargs).to(device)
        except Exception as cpu_exc:
            raise GpushapeError(_timm_failure(timm, name, cpu_exc)) from cpu_exc
    if attn is not None:
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = attn == "sdpa"
    model = model.to(dtype=dtype)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    channels, height, width = cfg.get("input_size", (3, 224, 224))
    if "img_size" in kwargs:
        size = kwargs["img_size"]
        height, width = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    channels = kwargs.get("in_chans", channels)
    return model, (make_input((batch or IMAGE_BATCH, channels, height, width), dtype, device),)


def _timm_failure(timm: ModuleType, name: str, exc: Exception) -> str:
    if "Unknown model" in str(exc):
        near = difflib.get_close_matches(name, timm.list_models(), n=4)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        return f"timm:{name}: timm {timm.__version__} has no model {name!r}{hint}"
    return f"timm:{name}: timm.create_model failed: {type(exc).__name__}: {_one_line(exc)}"


# Library classes gpushape's kernels compute exactly, by the module defining them and their name
# (a subclass, or a look-alike of the same name, may compute something else): what a transform
# swaps and its rule offers the fix for. ConvNeXt-V2's global response norm (kernels/grn):
LIBRARY_GRNS = frozenset(
    {
        ("timm.layers.grn", "GlobalResponseNorm"),
        ("transformers.models.convnextv2.modeling_convnextv2", "ConvNextV2GRN"),
    }
)


def is_library_grn(module: nn.Module) -> bool:
    """Whether `module` is exactly timm's GlobalResponseNorm or transformers' ConvNextV2GRN."""
    cls = type(module)
    return (cls.__module__, cls.__name__) in LIBRARY_GRNS


# Group norms gpushape's GroupNormAct computes exactly (F.group_norm on the module's own
# parameters), and those that also run an activation after it (timm's, `drop` and `act` modules
# beside the norm): what fuse-group-norm swaps and slow-group-norm offers it for.
LIBRARY_GROUP_NORMS = frozenset(
    {
        ("torch.nn.modules.normalization", "GroupNorm"),
        ("timm.layers.norm", "GroupNorm"),
        ("timm.layers.norm", "GroupNorm1"),
        ("timm.models.metaformer", "GroupNorm1NoBias"),
    }
)
LIBRARY_GROUP_NORM_ACTS = frozenset(
    {("timm.layers.norm_act", "GroupNormAct"), ("timm.layers.norm_act", "GroupNorm1Act")}
)


def is_library_group_norm(module: nn.Module, with_act: bool = False) -> bool:
    """Whether `module` is exactly one of LIBRARY_GROUP_NORMS (with_act: of
    LIBRARY_GROUP_NORM_ACTS), with timm's fast_norm (a half-precision variant) off."""
    cls = type(module)
    known = LIBRARY_GROUP_NORM_ACTS if with_act else LIBRARY_GROUP_NORMS
    return (cls.__module__, cls.__name__) in known and not getattr(module, "_fast_norm", False)
