"""Where a measurement came from: GPU, versions, time and command, stored with every result."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import torch


def environment() -> dict[str, Any]:
    """GPU name, SM count, torch / triton / CUDA versions, host, UTC time and the command line."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "host": platform.node(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            gpu_memory_bytes=props.total_memory,
        )
    else:
        env.update(gpu=None)
    return env


def command_line() -> str:
    """This process's command line; `python -m gpushape` where Python ran gpushape's
    `__main__.py` (sys.argv[0] is then a path inside the installed package)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "__main__.py" and Path(argv[0]).parent.name == "gpushape":
        argv[0:1] = ["python", "-m", "gpushape"]
    return " ".join(shlex.quote(a) for a in argv)


def write_results(path: str | Path, results: Any, **meta: Any) -> Path:
    """Write `{"environment": ..., **meta, "results": results}` as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"environment": environment(), **meta, "results": results}
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path


def copy_bandwidth_bytes_per_s(
    nbytes: int = 2**30, device: str = "cuda", repeats: int = 20
) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written (median of repeats)."""
    from .timer import time_fn

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    timing = time_fn(lambda: dst.copy_(src), warmup=3, repeats=repeats, device=device)
    return 2 * nbytes / timing.median_s
