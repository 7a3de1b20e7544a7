"""The chip an audit is for: a catalog spec, calibrated by a measured profile when one applies.

`profile="auto"` applies the profile shipped for the chip (`hardware/profiles/<name>.json`)
when there is one (the H200's), and the datasheet otherwise; a path applies that profile (it
must be for the chip asked for); None or False keeps the datasheet.

Besides the numbers `apply_profile` puts into the GPUSpec, a profile records what the probe
found about the chip's behaviour (`measured`: e.g. whether wave quantization showed at all);
rules may read those facts from `AuditContext.measured`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpushapeError
from ..hardware import GPUSpec, apply_profile, get_gpu, read_profile
from ..hardware.profile import bundled_profile_path

AUTO = "auto"


@dataclass(frozen=True)
class Target:
    spec: GPUSpec
    calibration: str | None = None  # where measured numbers came from; None: the datasheet
    measured: dict[str, Any] = field(default_factory=dict)  # the profile as the probe wrote it


def _from_profile(spec: GPUSpec, path: Path, label: str) -> Target:
    profile = read_profile(path)  # ProfileError (one line, exit 2) when unreadable
    measured_on = get_gpu(profile["gpu"])
    if measured_on.name != spec.name:
        raise GpushapeError(
            f"profile {str(path)!r} was measured on {measured_on.name}, "
            f"not {spec.name}: pass --gpu {measured_on.name} or another profile"
        )
    return Target(apply_profile(spec, profile, origin=label), label, profile)


def resolve_target(gpu: GPUSpec | str | None, profile: Any = AUTO) -> Target:
    """The target chip: `gpu` (default h100, or the chip a profile names) and its numbers."""
    if isinstance(gpu, Target):
        return gpu
    if profile in (None, False):
        return Target(get_gpu(gpu or "h100"))
    if profile == AUTO:
        spec = get_gpu(gpu or "h100")
        path = bundled_profile_path(spec)
        if path is None:
            return Target(spec)
        return _from_profile(spec, path, f"bundled profile {path.name}")
    path = Path(profile)
    if gpu is None:
        gpu = read_profile(path)["gpu"]
    return _from_profile(get_gpu(gpu), path, f"profile {path}")
