"""Reference networks (the zoo) and the resolution of a MODEL argument to a module and inputs.

    from gpushape.models import create_model, list_models, resolve_model
    model, inputs = create_model("resnet50", batch=8)            # meta device, bf16
    resolved = resolve_model("my_net.py:make", inputs=["8x3x224x224"])

Importing this package registers every zoo model (one module per architecture).
"""

from __future__ import annotations

from . import bert, gpt2, llama, resnet, vit  # noqa: F401  (each registers its models)
from .input_spec import parse_input_spec
from .registry import (
    ModelEntry,
    UnknownModelError,
    create_model,
    get_model_entry,
    known_model_names,
    list_models,
    register_model,
)
from .resolve import ResolvedModel, resolve_model

__all__ = [
    "ModelEntry",
    "ResolvedModel",
    "UnknownModelError",
    "create_model",
    "get_model_entry",
    "known_model_names",
    "list_models",
    "parse_input_spec",
    "register_model",
    "resolve_model",
]
