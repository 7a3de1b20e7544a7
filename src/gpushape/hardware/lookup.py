"""Find a GPUSpec by name or alias, or for the CUDA device this process sees."""

from __future__ import annotations

import difflib
import os
import re
import sys
from functools import cache

from ..errors import UnknownGPUError
from .catalog import CATALOG
from .spec import GPUSpec

_VENDOR_WORDS = ("nvidia-", "tesla-", "geforce-")


def normalize_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'; 'Tesla V100-SXM2-32GB' -> 'v100-sxm2-32gb'."""
    key = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    changed = True
    while changed:
        changed = False
        for word in _VENDOR_WORDS:
            if key.startswith(word):
                key, changed = key[len(word) :], True
    return key


@cache
def _index() -> dict[str, GPUSpec]:
    index: dict[str, GPUSpec] = {}
    for spec in CATALOG:
        for alias in (spec.name, *spec.aliases, spec.full_name):
            key = normalize_name(alias)
            if key in index and index[key] is not spec:
                raise AssertionError(f"alias {alias!r} names two chips")
            index[key] = spec
    return index


def known_names() -> list[str]:
    return [spec.name for spec in CATALOG]


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """A chip by catalog name or alias, case-insensitive; a GPUSpec is returned as it is."""
    if isinstance(name, GPUSpec):
        return name
    spec = _index().get(normalize_name(str(name)))
    if spec is None:
        near = difflib.get_close_matches(normalize_name(str(name)), _index().keys(), n=1)
        hint = f" (did you mean {_index()[near[0]].name}?)" if near else ""
        raise UnknownGPUError(f"unknown GPU {name!r}{hint}; known: {', '.join(known_names())}")
    return spec


def _nvidia_driver_present() -> bool:
    """False only where an NVIDIA driver certainly is absent (Linux without its /proc and /dev
    entries); elsewhere True, and torch decides."""
    if not sys.platform.startswith("linux"):
        return True
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl")


def current_gpu(device: int | None = None) -> GPUSpec | None:
    """The catalog entry for this process's CUDA device, with the driver's own numbers.

    SM count, memory size and L2 size come from the driver (they differ between SKUs that share
    a name); None when there is no CUDA device. Raises UnknownGPUError for a chip not catalogued.
    """
    if "torch" not in sys.modules and not _nvidia_driver_present():
        return None  # no driver, no CUDA device: spare the caller torch's import (~1 s)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(index)
    spec = get_gpu(props.name)
    driver = {"sm_count": props.multi_processor_count, "memory_bytes": props.total_memory}
    l2 = getattr(props, "L2_cache_size", 0)
    if l2:
        driver["l2_bytes"] = l2
    return spec.replace(note=f"driver ({props.name})", **driver)
