"""Why do real models' optimizer steps cost more per tensor than the probe's?

The loops' multi-tensor kernels (fit_optimizer_kernels.py) cost 0.13-0.23 us a tensor a kernel
on an H100 beyond their bytes; the probe's former 256 bf16 tensors of 4096 numbers cost about 0.02
(kernels-h100/probe_optimizer_kernels.json). This times one foreach and one fused SGD step
(momentum) over several sets of parameters: the probe's, the same with one number fewer per
tensor (sizes not a multiple of the kernels' vector width), and a real model's parameter shapes
(built on the meta device), in bf16 and in float32, and prints each step's kernel time, its
bytes' time at the copy rate, and the time left per tensor per kernel.

    python benchmarks/steps/diagnose_optimizer_tensors.py [--model MODEL] --out diag.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpushape.bench import copy_bandwidth_bytes_per_s, write_results  # noqa: E402
from gpushape.models import resolve_model  # noqa: E402
from gpushape.probe.workloads.optimizer import kernels_s  # noqa: E402
from gpushape.tracing.optimizer_step import current_step, fused_step  # noqa: E402


def sets(model: str, device: str) -> dict[str, list[tuple[tuple[int, ...], torch.dtype]]]:
    shapes = [tuple(p.shape) for p in resolve_model(model, batch=2).model.parameters()]
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).split(".")[-1]
        out[f"256 x 4096, {name}"] = [((4096,), dtype)] * 256
        out[f"256 x 4095, {name}"] = [((4095,), dtype)] * 256
        out[f"{model} shapes, {name}"] = [(s, dtype) for s in shapes]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="timm:efficientnet_b0")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    copy = copy_bandwidth_bytes_per_s(device=args.device) if args.device == "cuda" else 1e12
    rows = {}
    for name, params in sets(args.model, args.device).items():
        tensors = [
            torch.zeros(s, dtype=d, device=args.device, requires_grad=True) for s, d in params
        ]
        for t in tensors:
            t.grad = torch.zeros_like(t)
        for impl in ("foreach", "fused"):
            opt = torch.optim.SGD(tensors, lr=0.01, momentum=0.9, **{impl: True})
            measured = kernels_s(opt, args.device, args.steps)
            step = current_step(opt) if impl == "foreach" else fused_step(opt)
            left = measured - step.bytes_moved / copy
            rows[f"{name}, {impl}"] = {
                "tensors": step.parameters, "kernels": step.kernels, "bytes": step.bytes_moved,
                "measured_s": measured, "bytes_s": step.bytes_moved / copy,
                "left_per_tensor_kernel_s": left / step.parameters / step.kernels,
            }  # fmt: skip
    print(f"{'set':44} {'tensors':>7} {'MB':>7} {'meas us':>8} {'bytes us':>8} {'us/t/k':>7}")
    for name, r in rows.items():
        us = [r["measured_s"] * 1e6, r["bytes_s"] * 1e6, r["left_per_tensor_kernel_s"] * 1e6]
        print(f"{name[:44]:44} {r['tensors']:7d} {r['bytes'] / 1e6:7.1f} "
              f"{us[0]:8.1f} {us[1]:8.1f} {us[2]:7.3f}")  # fmt: skip
    if args.out:
        write_results(args.out, rows, model=args.model, copy_bytes_per_s=copy)


if __name__ == "__main__":
    main()
