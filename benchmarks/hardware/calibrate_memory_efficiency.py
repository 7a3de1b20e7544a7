"""Add the memory efficiency of eager kernels (by family) and the RGB stem's convolution rate to
an existing gpushape profile.

    python benchmarks/hardware/calibrate_memory_efficiency.py \
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o out/h200-sxm.json]

`gpushape probe` measures both with everything else; this script measures only those parts
(`gpushape.bench.probe_memory`, `probe_stem`) on this GPU, relative to the copy rate and GEMM
rate the profile already holds, and writes the profile back with "memory_efficiency" and
"conv_small_cin" keys (the rest unchanged), so a shipped profile gains them without
re-measuring its other numbers. Prints a table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.bench.probe_memory import measure_memory_efficiency  # noqa: E402
from gpushape.bench.probe_profile import write_profile  # noqa: E402
from gpushape.bench.probe_stem import measure_small_cin_conv  # noqa: E402
from gpushape.hardware.lookup import get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT)
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="where to write (default: over --profile)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--scale", type=float, default=1.0, help="workload size (cpu: 0.002)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("calibrate_memory_efficiency.py: needs a CUDA GPU (or --device cpu --scale 0.002)")
    profile = read_profile(args.profile)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(args.profile))
    rows = measure_memory_efficiency(spec, device=args.device, scale=args.scale,
                                     on_family=lambda f: print(f"measuring {f}", flush=True))
    profile["memory_efficiency"] = rows
    batch, size = (64, 224) if args.scale == 1.0 else (2, 32)
    stem = measure_small_cin_conv(spec, device=args.device, batch=batch, size=size)
    profile["conv_small_cin"] = stem
    profile.setdefault("probe", {})["memory_efficiency_measured_at"] = \
        dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    profile["probe"]["memory_efficiency_command"] = " ".join(sys.argv)
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {out}")
    print(f"\nRGB stem: {stem['efficiency']:.3f} of the GEMM model's rate "
          f"({stem['measured_s'] * 1e3:.3f} ms against {stem['model_s'] * 1e3:.3f} ms), "
          f"{stem['workload']}")
    print(f"\n{'family':<22} {'efficiency':>10} {'measured ms':>12} {'roofline ms':>12}  workload")
    for family, r in rows.items():
        if "error" in r:
            print(f"{family:<22} {'failed':>10}  {r['error']}")
            continue
        print(f"{family:<22} {r['efficiency']:>10.3f} {r['measured_s'] * 1e3:>12.3f} "
              f"{r['family_roofline_s'] * 1e3:>12.3f}  {r['workload']}")


if __name__ == "__main__":
    main()
