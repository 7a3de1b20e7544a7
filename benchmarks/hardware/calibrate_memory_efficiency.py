"""Add the memory efficiency of eager kernels (by family), the RGB stem's convolution rate and
fused attention's rates, and the host's dispatch rates (`--parts host`) to an existing
gpushape profile.

    python benchmarks/hardware/calibrate_memory_efficiency.py \
        [--profile src/gpushape/hardware/profiles/h200-sxm.json] [-o out/h200-sxm.json] \
        [--parts memory,stem,attention]

`gpushape probe` measures these with everything else; this script measures only those parts
(`gpushape.probe.memory`, `convs`, `attention`) on this GPU, relative to the
copy rate and GEMM rate the profile already holds, and writes the profile back with
"memory_efficiency", "conv_small_cin" and "attention" keys (the rest unchanged), so a shipped
profile gains them without re-measuring its other numbers. Prints a table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.hardware.lookup import current_gpu, get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.attention import measure_attention, pass_rates  # noqa: E402
from gpushape.probe.convs import measure_small_cin_conv  # noqa: E402
from gpushape.probe.host import measure_host  # noqa: E402
from gpushape.probe.memory import measure_memory_efficiency  # noqa: E402
from gpushape.probe.profile import write_profile  # noqa: E402

DEFAULT = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"


def other_chip(here, spec, path) -> str | None:
    """Why the profile at `path` (for chip `spec`) cannot be calibrated on the GPU `here`, or
    None: every efficiency is this GPU's time over the profile's copy and GEMM times, so another
    chip's profile would skew each row by the ratio of the two chips' rates (the H100's s2d
    rows of 2026-12-06, calibrated against the H200's: 0.212 where its own rates give 0.299)."""
    if here is None or here.name == spec.name:
        return None
    return (
        f"this GPU is {here.name}, {path} is {spec.name}'s profile; pass --profile with this "
        "GPU's (gpushape probe makes one)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT)
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="where to write (default: over --profile)"
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--scale", type=float, default=1.0, help="workload size (cpu: 0.002)")
    parser.add_argument(
        "--families",
        default=None,
        help="with --parts memory: only these families (comma-separated), "
        "merged into the profile's other families",
    )
    parser.add_argument(
        "--parts",
        default="memory,stem,attention",
        help="what to measure (comma-separated); the rest of the profile stays",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= {"memory", "stem", "attention", "host"}:
        sys.exit(f"calibrate_memory_efficiency.py: unknown parts {sorted(parts)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("calibrate_memory_efficiency.py: needs a CUDA GPU (or --device cpu --scale 0.002)")
    profile = read_profile(args.profile)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin=str(args.profile))
    wrong = other_chip(current_gpu() if args.device == "cuda" else None, spec, args.profile)
    if wrong:
        sys.exit(f"calibrate_memory_efficiency.py: {wrong}")
    rows = stem = attention = None
    if "memory" in parts:
        families = tuple(args.families.split(",")) if args.families else None
        rows = measure_memory_efficiency(
            spec,
            device=args.device,
            scale=args.scale,
            families=families,
            on_family=lambda f: print(f"measuring {f}", flush=True),
        )
        profile["memory_efficiency"] = {**(profile.get("memory_efficiency") or {}), **rows}
    if "stem" in parts:
        batch, size = (64, 224) if args.scale == 1.0 else (2, 32)
        stem = measure_small_cin_conv(spec, device=args.device, batch=batch, size=size)
        profile["conv_small_cin"] = stem
    if "attention" in parts:
        shape = (8, 16, 1024) if args.scale == 1.0 else (1, 2, 16)
        attention = measure_attention(
            spec,
            device=args.device,
            shape=shape,
            on_config=lambda c: print(f"measuring {c.describe}", flush=True),
        )
        profile["attention"] = {**(profile.get("attention") or {}), **attention}
    if "host" in parts:
        measured = measure_host(args.device)  # rates fitted elsewhere (module_glue, ...) stay
        profile["host"] = {**profile.get("host", {}), **measured}
        for key, row in measured.items():
            if "seconds" not in row:
                print(f"host {key:<12} failed: {row.get('error')}")
                continue
            print(f"host {key:<12} {row['seconds'] * 1e6:8.2f} us  {row['workload']}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for part in sorted(parts):
        profile.setdefault("probe", {})[f"{part}_calibrated_at"] = stamp
        profile["probe"][f"{part}_calibrate_command"] = " ".join(sys.argv)
    out = write_profile(profile, args.output or args.profile)
    print(f"wrote {out}")
    if attention:
        _print_attention(attention)
    if stem:
        print(
            f"\nRGB stem: {stem['efficiency']:.3f} of the GEMM model's rate "
            f"({stem['measured_s'] * 1e3:.3f} ms against {stem['model_s'] * 1e3:.3f} ms), "
            f"{stem['workload']}"
        )
    if rows:
        _print_memory(rows)


def _print_attention(rows: dict) -> None:
    print(f"\n{'attention':<46} {'fwd':>6} {'TFLOP/s':>8} {'bwd':>6} {'TFLOP/s':>8}")
    for r in rows.values():
        if "error" in r:
            print(f"{r['workload']:<46} failed: {r['error']}")
            continue
        fwd, bwd = pass_rates(r)
        print(
            f"{r['workload']:<46} {fwd:>6.3f} {r['tflops_fwd']:>8.0f} {bwd:>6.3f} "
            f"{r['tflops_bwd']:>8.0f}"
        )
        if r.get("kernels"):  # what ran: cuDNN's kernel or the forced backend's
            print("    " + ", ".join(k[:48] for k in r["kernels"][:4]))


def _print_memory(rows: dict) -> None:
    print(f"\n{'family':<22} {'efficiency':>10} {'measured ms':>12} {'roofline ms':>12}  workload")
    for family, r in rows.items():
        if "error" in r:
            print(f"{family:<22} {'failed':>10}  {r['error']}")
            continue
        print(
            f"{family:<22} {r['efficiency']:>10.3f} {r['measured_s'] * 1e3:>12.3f} "
            f"{r['family_roofline_s'] * 1e3:>12.3f}  {r['workload']}"
        )


if __name__ == "__main__":
    main()
