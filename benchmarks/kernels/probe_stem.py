"""CNN stems (a strided convolution on 3 input channels) as cuDNN runs them, against s2d-stem's
SpaceToDepthConv2d computing the same sums (src/gpushape/models/space_to_depth.py): where does the
space-to-depth stem pay?

With 3 input channels cuDNN pads the NHWC input to 8 channels every call (its
`nhwcAddPaddingKernel`) and runs an sm80 CUTLASS kernel. SpaceToDepthConv2d pads the input,
folds each s x s block of pixels into the channels (zero channels up to the alignment) and
runs a stride-1 convolution with the kernel folded the same way.

Stems (`--stems`, kernel:stride:padding:out_channels): ResNet's 7x7/2 to 64 channels, a 3x3/2
to 32 (EfficientNet-B0, timm's ResNet-D deep stem) and to 16 (MobileNetV3). Variants, each
alone and alternated (CUDA events, medians), forward and forward with the weight's gradient
(the input needs none: it is the data): `conv` (nn.Conv2d), `s2d12` (the fold, channels not
padded: 4 C), `s2d` (the module as shipped, channels padded to 16). Checks each variant's
output and weight gradient against `conv` in fp32.

    python benchmarks/kernels/probe_stem.py [--batch 256] [--stems 7:2:3:64,3:2:1:32]
                                            [--out probe_stem.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import time_fn, write_results
from gpushape.models.space_to_depth import SpaceToDepthConv2d

STEMS = "7:2:3:64,3:2:1:32,3:2:1:16"


def variants(conv: nn.Conv2d) -> dict[str, nn.Module]:
    """The stem as given and folded (channels 4 C, and aligned to 16)."""
    return {
        "conv": conv,
        "s2d12": SpaceToDepthConv2d(conv, align=4),
        "s2d": SpaceToDepthConv2d(conv),
    }


def errors(mods: dict[str, nn.Module], x: torch.Tensor) -> dict[str, dict[str, float]]:
    """Each variant's output and weight gradient against `conv`'s (relative to its largest)."""
    out = {}
    ref = None
    for name, m in mods.items():
        w = mods["conv"].weight
        y = m(x)
        (dw,) = torch.autograd.grad(y, w, torch.ones_like(y) / y.numel() ** 0.5)
        ref = ref or (y.detach(), dw)
        out[name] = {
            "output_max_err": (y - ref[0]).abs().max().item() / ref[0].abs().max().item(),
            "weight_grad_max_err": (dw - ref[1]).abs().max().item() / ref[1].abs().max().item(),
        }
    return out


def time_stem(conv: nn.Conv2d, x: torch.Tensor, rounds: int, repeats: int):
    """Each variant's forward and forward + weight gradient, alternated: (medians, all), ms."""
    mods, w = variants(conv), conv.weight
    dy = torch.randn_like(conv(x))

    def fwd(m):
        def run():
            with torch.no_grad():
                return m(x)

        return run

    def fwd_wgrad(m):
        return lambda: torch.autograd.grad(m(x), w, dy)

    runs = {f"{n} {what}": make(m) for n, m in mods.items()
            for what, make in (("fwd", fwd), ("fwd+wgrad", fwd_wgrad))}  # fmt: skip
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            times[key].append(time_fn(run, warmup=0, repeats=repeats).median_s * 1e3)
    return {key: statistics.median(v) for key, v in times.items()}, times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--stems", default=STEMS, help="kernel:stride:padding:out_channels, ...")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default="probe_stem.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_stem: needs a CUDA GPU")
    torch.manual_seed(0)
    cl = torch.channels_last
    x32 = torch.randn(args.batch, 3, args.size, args.size, device="cuda").to(memory_format=cl)
    x = x32.to(torch.bfloat16)
    results = {}
    for spec in args.stems.split(","):
        k, s, pad, o = (int(v) for v in spec.split(":"))
        conv = nn.Conv2d(3, o, k, stride=s, padding=pad, bias=False).cuda().to(memory_format=cl)
        checks = errors(variants(conv), x32)  # fp32: the same sums in another order
        conv = conv.to(torch.bfloat16)
        medians, times = time_stem(conv, x, args.rounds, args.repeats)
        results[f"{k}x{k}/{s} -> {o}"] = {"ms": medians, "times_ms": times, "checks_fp32": checks}
    print(f"stems at batch {args.batch}, {args.size}x{args.size}, bf16, channels_last; "
          f"ms (median of {args.rounds})")  # fmt: skip
    for stem, r in results.items():
        base = r["ms"]["conv fwd+wgrad"]
        for name in ("conv", "s2d12", "s2d"):
            f, b, c = r["ms"][f"{name} fwd"], r["ms"][f"{name} fwd+wgrad"], r["checks_fp32"][name]
            print(
                f"  {stem:14} {name:6} fwd {f:7.3f}  fwd+wgrad {b:7.3f}  x conv {base / b:5.2f}  "
                f"max rel err out {c['output_max_err']:.1e} dw {c['weight_grad_max_err']:.1e}"
            )
    write_results(args.out, results={"batch": args.batch, "size": args.size, "stems": results})


if __name__ == "__main__":
    main()
