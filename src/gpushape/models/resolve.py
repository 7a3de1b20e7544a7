"""Turn the CLI's MODEL argument into a module and example inputs.

MODEL is one of
- a zoo name (`resnet50`, `bert-base`, ...; see `gpushape.models.list_models()`),
- `path/to/file.py:factory`: the file is executed as a fresh module, with its directory on
  `sys.path` while it loads and while the factory runs (so it can import its siblings),
- `package.module:factory`: imported normally; the current directory is searched last.

A factory is any callable (a function, an nn.Module class) returning an `nn.Module` or
`(module, example_inputs)` with example_inputs a tensor or a tuple of tensors; an `nn.Module`
instance may be named directly. The factory gets those of `batch`, `dtype`, `device` that its
signature names (batch only when one was asked for).

Placement. The result ends up on `device`. When `device` is meta and the factory takes no
`device` argument, it runs inside a `torch.device("meta")` context: every parameter and tensor it
creates without an explicit device lands on meta, so a large model is audited without allocating
its weights (a factory that loads a checkpoint or pins tensors to an explicit device is not
affected and is moved to meta afterwards). When the factory takes no `dtype` argument, its
floating-point parameters and float example inputs are cast to `dtype`. A module left on the meta
device cannot be moved to a real one: that is an error.

Inputs. `inputs=["8x3x224x224", "8x512:int64"]` (the CLI's repeated `--input`) build the example
inputs and take precedence over the factory's own; with neither, resolution fails.

Errors. Everything that goes wrong is a `GpushapeError` (one line, exit 2 in the CLI): a device
this machine lacks (`cuda` without CUDA), a user file or factory that raises, and one that calls
`sys.exit()` (which would otherwise end gpushape with the user's exit code, silently).
KeyboardInterrupt passes through.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ..errors import GpushapeError, NoCudaError
from .input_spec import INPUT_FORM, inputs_from_specs
from .library import build_library_model, is_library_spec
from .registry import UnknownModelError, check_batch, check_dtype, create_model

PLACED_ARGS = ("batch", "dtype", "device")
SPEC_FORMS = (
    "a zoo name, path/to/file.py:factory, package.module:factory, hf:<model type> or timm:<name>"
)


@dataclass
class ResolvedModel:
    name: str
    model: nn.Module
    example_inputs: tuple[torch.Tensor, ...]


def resolve_model(
    spec: str,
    *,
    batch: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "meta",
    inputs: list[str] | None = None,
) -> ResolvedModel:
    """A zoo name or a user factory -> `ResolvedModel(name, model, example_inputs)`."""
    dtype = check_dtype(dtype)
    batch = None if batch is None else check_batch(batch)
    device = _to_device(device)
    if is_library_spec(spec):  # hf:NAME, timm:NAME (models/library.py)
        built = build_library_model(spec, batch=batch, dtype=dtype, device=device, inputs=inputs)
        return ResolvedModel(str(spec).strip(), *built)
    target, sep, attr = str(spec).strip().rpartition(":")
    if not sep:
        return _from_zoo(attr, batch=batch, dtype=dtype, device=device, inputs=inputs)
    if not target or not attr.isidentifier():
        raise GpushapeError(f"bad model {spec!r}: expected {SPEC_FORMS}")
    with _search_path_for(target):
        module = _import_target(target)
        factory = _get_attribute(module, target, attr)
        model, given, accepted = _build(factory, spec, batch=batch, dtype=dtype, device=device)
    example_inputs = inputs_from_specs(inputs, dtype, device) if inputs else given
    if not example_inputs:
        raise GpushapeError(
            f"{spec} gave no example inputs; return (module, example_inputs) from the factory "
            f"or pass --input {INPUT_FORM}"
        )
    model, example_inputs = _place(
        model,
        example_inputs,
        spec,
        device=device,
        dtype=None if "dtype" in accepted else dtype,
        cast_inputs=not inputs,
    )
    return ResolvedModel(name=str(spec), model=model, example_inputs=example_inputs)


def _to_device(device: str | torch.device) -> torch.device:
    """A torch device this machine has; meta and cpu always are."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise GpushapeError(
            f"bad device {device!r}: not a torch device; use meta (the default), cpu, cuda "
            f"or cuda:N"
        ) from exc
    if device.type in ("meta", "cpu"):
        return device
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NoCudaError(
            f"device {str(device)!r} is not available: torch sees no CUDA GPU on this machine; "
            f"trace on meta (the default) or cpu"
        )
    try:
        torch.empty(0, device=device)
    except Exception as exc:
        raise GpushapeError(
            f"device {str(device)!r} is not available here ({_first_sentence(exc)}); "
            f"trace on meta (the default) or cpu"
        ) from exc
    return device


def _first_sentence(exc: BaseException, limit: int = 160) -> str:
    """The start of a long message (torch's dispatcher errors run to pages)."""
    text = _one_line(exc).split(". ")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exit_call(exc: SystemExit) -> str:
    """'sys.exit(3)', 'sys.exit()', "sys.exit('no GPU')": what a SystemExit came from."""
    return "sys.exit()" if exc.code is None else f"sys.exit({exc.code!r})"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


def _from_zoo(name, *, batch, dtype, device, inputs) -> ResolvedModel:
    if name.endswith(".py"):
        raise GpushapeError(f"{name!r} names a file but no factory; write {name}:FACTORY")
    try:
        model, example_inputs = create_model(name, batch=batch, dtype=dtype, device=device)
    except UnknownModelError as exc:
        raise UnknownModelError(
            f"{exc}; or give path/to/file.py:factory, package.module:factory, "
            "hf:<model type> or timm:<name>"
        ) from None
    if inputs:
        example_inputs = inputs_from_specs(inputs, dtype, device)
    return ResolvedModel(name=name, model=model, example_inputs=example_inputs)


# --- finding the factory ---------------------------------------------------------------------


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


@contextlib.contextmanager
def _search_path_for(target: str) -> Iterator[None]:
    """A file's own directory first (its siblings), or the working directory last (a package)."""
    is_file = _is_path(target)
    entry = str(Path(target).expanduser().resolve().parent) if is_file else os.getcwd()
    added = entry not in sys.path
    if added:
        sys.path.insert(0 if is_file else len(sys.path), entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


def _import_target(target: str) -> ModuleType:
    return _import_file(target) if _is_path(target) else _import_module(target)


def _import_file(target: str) -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_file():
        raise GpushapeError(f"model file not found: {target} (looked for {path.resolve()})")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"_gpushape_user_{path.stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise GpushapeError(f"cannot load {target} as Python source")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses, pickling and typing look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:
        del sys.modules[name]
        raise GpushapeError(f"importing {target} called {_exit_call(exc)}") from None
    except Exception as exc:
        del sys.modules[name]
        raise GpushapeError(
            f"importing {target} failed: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    return module


def _import_module(target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        parts = target.split(".")
        if exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            raise GpushapeError(
                f"cannot import module {target!r}: {_one_line(exc)} (is it installed, or in the "
                f"current directory?)"
            ) from exc
        raise GpushapeError(
            f"importing {target!r} failed: ModuleNotFoundError: {_one_line(exc)}"
        ) from exc
    except SystemExit as exc:
        raise GpushapeError(f"importing {target!r} called {_exit_call(exc)}") from None
    except Exception as exc:
        raise GpushapeError(
            f"importing {target!r} failed: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc


def _get_attribute(module: ModuleType, target: str, attr: str) -> Any:
    if hasattr(module, attr):
        return getattr(module, attr)
    defined = sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and getattr(value, "__module__", None) == module.__name__
    )
    listing = f"; it defines: {', '.join(defined[:12])}" if defined else ""
    raise GpushapeError(f"{target} has no attribute {attr!r}{listing}")


# --- building --------------------------------------------------------------------------------


def _build(factory: Any, label: str, *, batch, dtype, device):
    """(model, example_inputs or None, names of PLACED_ARGS the factory took)."""
    if isinstance(factory, nn.Module):
        if batch is not None:
            _no_batch_argument(label)
        return factory, None, set()
    if not callable(factory):
        raise GpushapeError(
            f"{label} is {_describe(factory)}, not a factory; name a function or class "
            f"that returns an nn.Module or (module, example_inputs)"
        )
    accepted = _accepted_args(factory, label)
    if batch is not None and "batch" not in accepted:
        _no_batch_argument(label)
    given = {"batch": batch, "dtype": dtype, "device": device}
    kwargs = {name: given[name] for name in accepted if given[name] is not None}
    meta_context = device.type == "meta" and "device" not in accepted
    try:
        with torch.device("meta") if meta_context else contextlib.nullcontext():
            result = factory(**kwargs)
    except GpushapeError:
        raise
    except SystemExit as exc:
        raise GpushapeError(f"model factory {label!r} called {_exit_call(exc)}") from None
    except Exception as exc:
        raise GpushapeError(
            f"factory {label} raised {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    model, example_inputs = _split_result(result, label)
    return model, example_inputs, accepted


def _no_batch_argument(label: str) -> None:
    raise GpushapeError(
        f"{label} takes no batch argument, so a batch size cannot be applied; "
        f"give the input shapes with --input {INPUT_FORM}"
    )


def _accepted_args(factory: Callable, label: str) -> set[str]:
    """Which of batch/dtype/device the factory names; an error for arguments nobody supplies."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()  # a builtin without a signature: call it with nothing
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (*named, inspect.Parameter.POSITIONAL_ONLY)
        and p.name not in PLACED_ARGS
    ]
    if required:
        raise GpushapeError(
            f"factory {label} needs argument(s) {', '.join(required)}, which gpushape cannot "
            f"supply; give them defaults (only batch, dtype and device are passed)"
        )
    return {p.name for p in params if p.kind in named and p.name in PLACED_ARGS}


def _split_result(result: Any, label: str) -> tuple[nn.Module, tuple[torch.Tensor, ...] | None]:
    if isinstance(result, nn.Module):
        return result, None
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module):
        model, inputs = result
        if inputs is None:
            return model, None
        if isinstance(inputs, torch.Tensor):
            return model, (inputs,)
        if isinstance(inputs, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in inputs):
            return model, tuple(inputs)
        raise GpushapeError(
            f"factory {label} returned example inputs that are {_describe(inputs)}; "
            f"expected a tensor or a tuple of tensors"
        )
    raise GpushapeError(
        f"factory {label} returned {_describe(result)}; expected an nn.Module or "
        f"(module, example_inputs)"
    )


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in value[:4])
        return f"a {type(value).__name__} of ({inner}{', ...' if len(value) > 4 else ''})"
    return f"an object of type {type(value).__name__!r}"


def _place(model, example_inputs, label, *, device, dtype, cast_inputs):
    """Everything on `device`; floats cast to `dtype` unless it is None (the factory chose)."""
    tensors = chain(model.parameters(), model.buffers(), example_inputs)
    if device.type != "meta" and any(t.is_meta for t in tensors):
        raise GpushapeError(
            f"{label} has parameters or inputs on the meta device, which hold no values, but "
            f"device {str(device)!r} was asked; build real weights, or audit on the meta device"
        )
    model = model.to(device=device) if dtype is None else model.to(device=device, dtype=dtype)

    def place(t: torch.Tensor) -> torch.Tensor:
        cast = cast_inputs and dtype is not None and t.is_floating_point()
        return t.to(device=device, dtype=dtype) if cast else t.to(device=device)

    return model, tuple(place(t) for t in example_inputs)
