"""ResNet's stem convolution (3 -> 64 channels, 7x7, stride 2, padding 3) as cuDNN runs it,
against the same convolution computed on a space-to-depth input: is there a faster stem that
computes the same thing?

With 3 input channels cuDNN pads the NHWC input to 8 channels every call (its
`nhwcAddPaddingKernel`: 0.44 ms a step in ResNet-50's `optimize+graph` on an H100) and runs an
sm80 CUTLASS kernel (1.53 ms there). The same sums can run as a stride-1 4x4 convolution over
a space-to-depth view of the input: pad by 3, fold each 2x2 block of pixels into 12 channels
(`pixel_unshuffle`), and fold the 7x7 kernel (zero-padded to 8x8) the same way, so that
  W'[o, 4c + 2p + q, a, b] = w[o, c, 2a + p, 2b + q]     (0 where 2a + p or 2b + q is 7).
Same outputs up to the order of the sums, 1.31x the stem's multiply-adds (192 a output against
147: +0.9% of ResNet-50's), gradients to the original 7x7 weight through the fold.

Variants, each alone and alternated (CUDA events, medians): `conv` (F.conv2d as given),
`s2d` (the fold, 12 channels), `s2d16` (the fold with the channels zero-padded to 16); for
each the forward and the forward with the weight's gradient (the input needs none: it is the
data). Checks every variant's output and weight gradient against `conv` in fp32.

    python benchmarks/kernels/probe_stem.py [--batch 256] [--out probe_stem.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import time_fn, write_results


def fold_weight(w: torch.Tensor, channels: int = 0) -> torch.Tensor:
    """(O, C, 7, 7) -> (O, 4C, 4, 4), the kernel of the stride-1 convolution over the
    space-to-depth input; `channels` > 4C pads its input channels with zeros."""
    o, c, kh, kw = w.shape
    if (kh, kw) != (7, 7):
        raise ValueError(f"fold_weight: expected a 7x7 kernel, got {kh}x{kw}")
    w8 = F.pad(w, (0, 1, 0, 1))  # (O, C, 8, 8): u = 2a + p, v = 2b + q
    folded = w8.reshape(o, c, 4, 2, 4, 2).permute(0, 1, 3, 5, 2, 4).reshape(o, 4 * c, 4, 4)
    if channels > 4 * c:
        folded = F.pad(folded, (0, 0, 0, 0, 0, channels - 4 * c))
    return folded


def s2d_input(x: torch.Tensor, channels: int = 0) -> torch.Tensor:
    """The stem's input padded by 3 and folded 2x2 -> 4C channels (channels_last);
    `channels` > 4C pads the channels with zeros."""
    folded = F.pixel_unshuffle(F.pad(x, (3, 3, 3, 3)), 2)
    if channels > folded.shape[1]:
        folded = F.pad(folded, (0, 0, 0, 0, 0, channels - folded.shape[1]))
    return folded.contiguous(memory_format=torch.channels_last)


def stem_s2d(x: torch.Tensor, w: torch.Tensor, channels: int = 0) -> torch.Tensor:
    """F.conv2d(x, w, stride=2, padding=3) for a 7x7 kernel, on the space-to-depth input."""
    return F.conv2d(s2d_input(x, channels), fold_weight(w, channels))


VARIANTS = {
    "conv": lambda x, w: F.conv2d(x, w, stride=2, padding=3),
    "s2d": lambda x, w: stem_s2d(x, w),
    "s2d16": lambda x, w: stem_s2d(x, w, 16),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default="probe_stem.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_stem: needs a CUDA GPU")
    torch.manual_seed(0)
    x32 = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    w32 = (torch.randn(64, 3, 7, 7, device="cuda") * 0.1).to(memory_format=torch.channels_last)
    checks = {}
    ref = None
    for name, fn in VARIANTS.items():  # fp32: the same sums in another order
        w = w32.clone().requires_grad_()
        y = fn(x32, w)
        (dw,) = torch.autograd.grad(y, w, torch.ones_like(y) / y.numel() ** 0.5)
        ref = ref or (y.detach(), dw)
        checks[name] = {
            "output_max_err": (y - ref[0]).abs().max().item() / ref[0].abs().max().item(),
            "weight_grad_max_err": (dw - ref[1]).abs().max().item() / ref[1].abs().max().item(),
        }
    x = x32.to(torch.bfloat16)
    w = w32.to(torch.bfloat16).requires_grad_()
    dy = torch.randn_like(VARIANTS["conv"](x, w))

    def fwd(fn):
        return lambda: fn(x, w.detach())

    def fwd_wgrad(fn):
        return lambda: torch.autograd.grad(fn(x, w), w, dy)

    runs = {f"{n} {what}": make(fn) for n, fn in VARIANTS.items()
            for what, make in (("fwd", fwd), ("fwd+wgrad", fwd_wgrad))}  # fmt: skip
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for k, run in runs.items():
            times[k].append(time_fn(run, warmup=0, repeats=args.repeats).median_s * 1e3)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"stem at batch {args.batch}, bf16, channels_last; ms (median of {args.rounds})")
    for name in VARIANTS:
        f, b = medians[f"{name} fwd"], medians[f"{name} fwd+wgrad"]
        base = medians["conv fwd+wgrad"]
        print(f"  {name:6} fwd {f:7.3f}  fwd+wgrad {b:7.3f}  x conv {base / b:5.2f}  "
              f"max rel err out {checks[name]['output_max_err']:.1e} "
              f"dw {checks[name]['weight_grad_max_err']:.1e}")  # fmt: skip
    write_results(args.out, results={"batch": args.batch, "ms": medians, "times_ms": times,
                                     "checks_fp32": checks})  # fmt: skip


if __name__ == "__main__":
    main()
