"""Fit the GEMM kernel latency (`gemm_latency`, gpushape.probe.profile.fit_gemm_latency) on a
profile's own GEMM sweeps and add it to the profile, leaving its other numbers as they are.

    python benchmarks/hardware/fit_gemm_latency.py --profile P.json [-o out.json] [--dry-run]

`gpushape probe` fits it as it measures; this gives it to a profile measured before the fit
existed, from the sweep rows that profile already holds (no GPU needed: the fit reads the
measured times and prices them with the profile's measured peaks and copy rate).
"""

from __future__ import annotations

import sys

from _on_profile import profile_parser, write_stamped

from gpushape.hardware.lookup import get_gpu
from gpushape.hardware.profile import apply_profile, read_profile
from gpushape.probe.profile import fit_gemm_latency


def main() -> None:
    parser = profile_parser(__doc__)
    parser.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = parser.parse_args()
    profile = read_profile(args.profile)
    ceilings = profile.get("ceilings", {})
    # the spec the probe fits with: the measured copy rate and peaks, nothing fitted after them
    measured = {k: ceilings[k] for k in ("copy_bytes_per_s", "gemm_flops") if k in ceilings}
    spec = apply_profile(get_gpu(profile["gpu"]), {"ceilings": measured})
    fit = fit_gemm_latency(profile.get("sweeps", {}), spec)
    if not fit:
        sys.exit(f"fit_gemm_latency.py: {args.profile} holds too few GEMM sweep points to fit")
    errors = fit["median_abs_log_error"]
    print(
        f"{profile['gpu']}: {fit['seconds'] * 1e6:.2f} us a GEMM kernel, over {fit['points']} "
        f"points; median |log(predicted / measured)| {errors['without']:.3f} -> "
        f"{errors['with']:.3f}"
    )
    if args.dry_run:
        return
    profile["gemm_latency"] = fit
    write_stamped(
        profile, args.output or args.profile, "gemm_latency_fitted_at", "gemm_latency_command"
    )


if __name__ == "__main__":
    main()
