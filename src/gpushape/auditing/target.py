"""The chip an audit is for: a catalog spec, calibrated by a measured profile when one applies.

The chip: the one named (`gpu`), else the one a profile file was measured on, else the CUDA GPU
present when the catalog has it, else h100 (`DEFAULT_GPU`: no GPU here, as on a laptop or a CI
runner, or one the catalog lacks). `Target.reason` says which of these chose it, for the
report's header.

`profile="auto"` applies the profile shipped for the chip (`hardware/profiles/<name>.json`)
when there is one (the H100's and the H200's), and the datasheet otherwise; a path applies that
profile (it must be for the chip asked for); None or False keeps the datasheet. A GPUSpec that
`apply_profile` already calibrated is taken as it is: the shipped profile laid over it would
replace the caller's rows with its own.

Besides the numbers `apply_profile` puts into the GPUSpec, a profile records what the probe
found about the chip's behaviour (`measured`: e.g. whether wave quantization showed at all);
rules may read those facts from `AuditContext.measured`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpushapeError, UnknownGPUError
from ..hardware import GPUSpec, apply_profile, current_gpu, get_gpu, read_profile
from ..hardware.alignment import DEFAULT_GPU  # the chip audited when none is named or found
from ..hardware.profile import bundled_profile_path, calibrated_by

AUTO = "auto"


@dataclass(frozen=True)
class Target:
    spec: GPUSpec
    calibration: str | None = None  # where measured numbers came from; None: the datasheet
    measured: dict[str, Any] = field(default_factory=dict)  # the profile as the probe wrote it
    reason: str | None = None  # why this chip: "from --gpu", "the GPU present", "default: ..."


def _from_profile(spec: GPUSpec, path: Path, label: str, reason: str) -> Target:
    profile = read_profile(path)  # ProfileError (one line, exit 2) when unreadable
    measured_on = get_gpu(profile["gpu"])
    if measured_on.name != spec.name:
        raise GpushapeError(
            f"profile {str(path)!r} was measured on {measured_on.name}, "
            f"not {spec.name}: pass --gpu {measured_on.name} or another profile"
        )
    return Target(apply_profile(spec, profile, origin=label), label, profile, reason)


def default_gpu(flag: str = "gpu=...") -> tuple[GPUSpec, str]:
    """The chip audited when none is named, and why: the CUDA GPU present when the catalog has
    it (with the driver's SM count, memory and L2), else h100. `flag` is how a user names one,
    for the reason's hint ("--gpu" on the command line)."""
    try:
        present = current_gpu()
    except UnknownGPUError:
        return get_gpu(DEFAULT_GPU), f"default: the GPU present is not in the catalog; pass {flag}"
    except Exception:  # a broken driver or CUDA install: audit for the default chip
        return get_gpu(DEFAULT_GPU), f"default: the CUDA GPU here cannot be queried; pass {flag}"
    if present is None:
        return get_gpu(DEFAULT_GPU), f"default: no CUDA GPU here; pass {flag}"
    return present, "the GPU present"


def resolve_target(
    gpu: GPUSpec | str | None, profile: Any = AUTO, *, flag: str = "gpu=..."
) -> Target:
    """The target chip and its numbers: `gpu`, or the chip a profile was measured on, or the
    `default_gpu()`; `flag` is how the caller names a chip ("--gpu" for the CLI), quoted in the
    reason the report prints."""
    if isinstance(gpu, Target):
        return gpu
    if profile not in (None, False, AUTO):
        path = Path(profile)
        if gpu is None:
            measured_on = read_profile(path)["gpu"]
            return _from_profile(
                get_gpu(measured_on),
                path,
                f"profile {path}",
                "the chip the profile was measured on",
            )
        return _from_profile(get_gpu(gpu), path, f"profile {path}", f"from {flag}")
    spec, reason = (get_gpu(gpu), f"from {flag}") if gpu is not None else default_gpu(flag)
    if profile in (None, False):
        return Target(spec, reason=reason)
    origin = calibrated_by(spec)
    if origin is not None:  # a GPUSpec its caller calibrated
        return Target(spec, origin, reason=reason)
    path = bundled_profile_path(spec)
    if path is None:
        return Target(spec, reason=reason)
    return _from_profile(spec, path, f"bundled profile {path.name}", reason)
