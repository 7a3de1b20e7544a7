"""The optional libraries behind `hf:` and `timm:` models: importing them, or a one-line
`MissingLibraryError` naming the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import GpushapeError

_INSTALL = {"hf": "transformers", "timm": "timm"}


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
