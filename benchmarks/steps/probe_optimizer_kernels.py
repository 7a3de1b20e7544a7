"""The full probe's optimizer-step measurement on its own, set beside the shipped figures.

    python benchmarks/steps/probe_optimizer_kernels.py [--profile PATH] [--out optimizer.json]

`gpushape probe` (full) steps SGD with momentum and AdamW, foreach and fused, over a ResNet-50's
parameter shapes and a few large bf16 tensors and fits what the cost model prices an optimizer
step with (`gpushape.probe.workloads.optimizer`). The shipped figures come from another source: the
multi-tensor kernels of timed training loops (benchmarks/steps/fit_optimizer_kernels.py). This
runs the probe's measurement alone (seconds, not the full probe's minutes) and prints, for each
timed step, the measured kernel time beside the probe's own fit and the profile's pricing: where
the two sources agree the probe can replace the loops' fit on a GPU nobody has looped on.

The profile defaults to the one shipped for this GPU (the H200's; an H100's from
benchmarks/results/probe-h100).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from fit_optimizer_kernels import PROFILES  # noqa: E402  (the shipped figures, by GPU)

from gpushape.bench import copy_bandwidth_bytes_per_s, write_results  # noqa: E402
from gpushape.hardware.lookup import current_gpu, get_gpu  # noqa: E402
from gpushape.hardware.profile import apply_profile, read_profile  # noqa: E402
from gpushape.probe.workloads.optimizer import measure_optimizer_kernels, predicted_s  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", type=Path, default=None, help="the figures to compare with")
    p.add_argument("--steps", type=int, default=10, help="profiled steps per timing")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--device", default="cuda", help="cpu: a smoke test (tiny tensors)")
    args = p.parse_args()
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        sys.exit("probe_optimizer_kernels.py: needs a CUDA device; none is visible")
    name = torch.cuda.get_device_name() if on_gpu else "H200 (CPU smoke test)"
    path = args.profile or next((v for k, v in PROFILES.items() if k.upper() in name), None)
    if path is None:
        sys.exit(f"probe_optimizer_kernels.py: no shipped profile for {name}; pass --profile")
    profile = read_profile(path)
    shipped = apply_profile(get_gpu(profile["gpu"]), profile)
    here = current_gpu() if on_gpu else shipped
    measured = measure_optimizer_kernels(
        apply_profile(here, profile), device=args.device, scale=1.0 if on_gpu else 0.01,
        steps=args.steps,
    )  # fmt: skip
    bandwidth = shipped.attainable_bandwidth_bytes_per_s()
    copy = copy_bandwidth_bytes_per_s() if on_gpu else float("nan")
    rows = []
    for step in measured["steps"]:
        probe_s = predicted_s(step, measured["rows"], bandwidth)
        shipped_s = predicted_s(step, profile.get("optimizer_kernels", {}), bandwidth)
        rows.append({**step, "probe_fit_s": probe_s, "shipped_s": shipped_s})
    print(f"{'implementation':16} {'efficiency':>10} {'us a tensor a kernel':>21}   shipped")
    for key, row in measured["rows"].items():
        old = profile.get("optimizer_kernels", {}).get(key, {})
        per = f"{row['tensor_seconds'] * 1e6:.3f}" if "tensor_seconds" in row else ""
        was = f"{old.get('efficiency', float('nan')):.3f}"
        if "tensor_seconds" in old:
            was += f" + {old['tensor_seconds'] * 1e6:.3f}"
        print(f"{key:16} {row['efficiency']:10.3f} {per:>21}   {was}")
    print(f"\ncopy rate {copy / 1e9:.0f} GB/s here, profile {bandwidth / 1e9:.0f} GB/s")
    print(f"{'step':28} {'class':6} {'impl':8} {'measured us':>11} {'probe fit':>9} {'shipped':>8}")
    for r in rows:
        fit_x, shipped_x = r["probe_fit_s"] / r["measured_s"], r["shipped_s"] / r["measured_s"]
        print(f"{r['model'][:28]:28} {r['class']:6} {r['impl']:8} {r['measured_s'] * 1e6:11.1f} "
              f"{fit_x:9.2f} {shipped_x:8.2f}")  # fmt: skip
    for key, err in measured["errors"].items():
        print(f"not timed: {key}: {err}")
    if args.out:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        results = {"fit": measured["rows"], "steps": rows, "errors": measured["errors"]}
        write_results(args.out, results, profile=str(shown), copy_bytes_per_s=copy)


if __name__ == "__main__":
    main()
