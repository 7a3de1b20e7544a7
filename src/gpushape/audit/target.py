"""The chip an audit is for: a catalog spec, calibrated by a measured profile when one applies.

`profile="auto"` applies the profile shipped for the chip (`hardware/profiles/<name>.json`)
when there is one (the H200's), and the datasheet otherwise; a path applies that profile (it
must be for the chip asked for); None or False keeps the datasheet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import GpushapeError
from ..hardware import GPUSpec, get_gpu, load_profile
from ..hardware.profile import bundled_profile_path, calibrated

AUTO = "auto"


def resolve_target(gpu: GPUSpec | str | None, profile: Any = AUTO
                   ) -> tuple[GPUSpec, str | None]:
    """(spec, where its calibrated numbers came from, or None for the datasheet)."""
    if profile in (None, False):
        return get_gpu(gpu or "h100"), None
    if profile == AUTO:
        spec = get_gpu(gpu or "h100")
        path = bundled_profile_path(spec)
        if path is None:
            return spec, None
        return calibrated(spec), f"bundled profile {path.name}"
    path = Path(profile)
    measured = load_profile(path)  # ProfileError (one line, exit 2) when unreadable
    if gpu is not None:
        asked = get_gpu(gpu)
        if asked.name != measured.name:
            raise GpushapeError(f"profile {str(path)!r} was measured on {measured.name}, "
                                f"not {asked.name}: pass --gpu {measured.name} or another "
                                f"profile")
    return measured, f"profile {path}"
