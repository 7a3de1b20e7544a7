"""A patch embedding's NCHW conversions, from the two timings a profile's "patch_conv@<side>"
rows already hold (channels_last `measured_s`, NCHW `nchw_measured_s`), into the same profile
as "nchw_conversion@<side>" (tracing/layout.py `conversion_family`). `gpushape probe` writes
these rows itself since they were added; this fills them into a profile measured before.

    python benchmarks/kernels/fit_patch_conversion.py \\
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o PROFILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.convs import CONVERSION, conversion_row  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402
from gpushape.probe.workloads import WORKLOADS  # noqa: E402
from gpushape.tracing.families import PATCH_CONV  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"


def fit(profile: dict) -> dict[str, dict]:
    """{"nchw_conversion@<side>": row} for each patch side measured in both layouts."""
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    rows = profile.get("memory_efficiency", {})
    out = {}
    for work in WORKLOADS:
        row = rows.get(work.family)
        if not work.family.startswith(PATCH_CONV + "@") or not row:
            continue
        if "nchw_measured_s" not in row or row.get("scale", 1.0) != 1.0:
            continue
        conv = work.build(1.0)
        made = conversion_row(row, conv, 64, 224, spec)  # measure_stem_conv's sizes
        if made is not None:
            out[f"{CONVERSION}@{conv.kernel_size[0]}"] = made
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=str(DEFAULT))
    p.add_argument("-o", "--output", help="where to write the profile (default: --profile)")
    args = p.parse_args(argv)
    profile = read_profile(args.profile)
    rows = fit(profile)
    profile["memory_efficiency"] = {**profile.get("memory_efficiency", {}), **rows}
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {len(rows)} figures into {out}")
    for name, r in rows.items():
        extra_us = (r["measured_s"] - r["channels_last_s"]) * 1e6
        print(
            f"{name:22} {r['efficiency']:.4f} ({extra_us:6.1f} us more in NCHW, "
            f"{r['family_roofline_s'] * 1e6:6.1f} us at the copy rate)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
