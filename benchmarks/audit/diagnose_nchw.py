"""Where a convolutional network loses time in NCHW against channels_last, on one GPU (bf16,
training), next to what the nchw-conv rule prices.

    python benchmarks/audit/diagnose_nchw.py [--out diagnose_nchw.json]

1. Workloads, each one training step (forward, then the gradients of every parameter and of
   the input where it needs one), timed in both layouts from CUDA graphs and alternated
   (`gpushape.bench.compare`): ResNet-50 at batch 64; a stage-1 bottleneck's three
   convolutions alone (the probe's nchw_conversion workload); the same bottleneck with
   BatchNorm, ReLU and its residual add; the stem (7x7 convolution, BatchNorm, ReLU, max pool);
   a stride-2 bottleneck with its downsample branch. For each: the NCHW and channels_last
   medians, their difference, and the bytes the nchw-conv rule counts for it (its own finding on
   the meta trace) at the copy rate.
2. ResNet-50's kernels under torch.profiler in both layouts, summed by kernel name: the 25
   names with the largest NCHW - channels_last difference.
Writes the JSON (environment, command, rows); prints the tables last.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.auditing import audit  # noqa: E402
from gpushape.bench import compare, cuda_graph, kernel_totals  # noqa: E402
from gpushape.bench.record import environment  # noqa: E402
from gpushape.hardware import current_gpu, get_gpu  # noqa: E402
from gpushape.models import create_model  # noqa: E402
from gpushape.models.resnet import Bottleneck  # noqa: E402

DT = torch.bfloat16


def convs(c, m):
    """A bottleneck's three convolutions alone (what the probe's nchw_conversion times)."""
    return nn.Sequential(
        nn.Conv2d(c, m, 1, bias=False),
        nn.Conv2d(m, m, 3, 1, 1, bias=False),
        nn.Conv2d(m, c, 1, bias=False),
    )


def stem():
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
    )


def workloads():
    """name -> (build(device) -> module, input shape, input needs grad); the bottlenecks are
    gpushape's own ResNet-50 blocks (models/resnet.py)."""
    return {
        "ResNet-50, batch 64": (
            lambda dev: create_model("resnet50", batch=64, device=dev)[0],
            (64, 3, 224, 224),
            False,
        ),
        "bottleneck convolutions (256-64-256 @56)": (
            lambda dev: convs(256, 64).to(dev),
            (64, 256, 56, 56),
            True,
        ),
        "bottleneck + BN + ReLU + add (256-64-256 @56)": (
            lambda dev: Bottleneck(256, 64).to(dev),
            (64, 256, 56, 56),
            True,
        ),
        "stem: 7x7/2 conv + BN + ReLU + max pool @224": (
            lambda dev: stem().to(dev),
            (64, 3, 224, 224),
            False,
        ),
        "stride-2 bottleneck + downsample (256-128-512 @56)": (
            lambda dev: Bottleneck(256, 128, stride=2).to(dev),
            (64, 256, 56, 56),
            True,
        ),
    }


def step_fn(model, x):
    params = [p for p in model.parameters()] + ([x] if x.requires_grad else [])
    out = model(x)
    gy = torch.randn_like(out)

    def step():
        return torch.autograd.grad(model(x), params, gy)

    return step


def prepared(build, shape, needs_grad, layout):
    torch.manual_seed(0)
    model = build("cuda").to(DT).to(memory_format=layout).train()
    x = torch.randn(shape, device="cuda", dtype=DT).contiguous(memory_format=layout)
    return model, x.requires_grad_(needs_grad)


def rule_bytes(build, shape, needs_grad) -> tuple[int, float]:
    """The nchw-conv finding's conversion bytes and saving at the copy rate (no profile)."""
    model = build("meta").to(DT)
    x = torch.empty(shape, device="meta", dtype=DT).requires_grad_(needs_grad)
    gpu = current_gpu() or get_gpu("h200")
    report = audit(model, (x,), gpu=gpu, profile=None, train=True, rules=["nchw-conv"])
    if not report.findings:
        return 0, 0.0
    f = report.findings[0]
    return f.evidence["conversion_bytes"], f.est_saving_s


def kernels(step) -> Counter:
    """Device microseconds a step, summed by kernel name."""
    return Counter(kernel_totals(step, warmup=2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="diagnose_nchw.json")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel table")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("diagnose_nchw.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows, profiles = [], {}
    layouts = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
    for name, (build, shape, needs_grad) in workloads().items():
        steps = {}
        for lname, layout in layouts.items():
            model, x = prepared(build, shape, needs_grad, layout)
            step = step_fn(model, x)
            step()
            if name.startswith("ResNet-50") and not args.no_profile:  # eager, before capture
                profiles[lname] = kernels(step)
            steps[lname] = cuda_graph(step)
        t = compare(steps, rounds=args.rounds, repeats_per_round=10, warmup=2)
        nbytes, rule_s = rule_bytes(build, shape, needs_grad)
        nchw, cl = t["nchw"].median_s, t["channels_last"].median_s
        rows.append(
            dict(
                workload=name,
                nchw_ms=nchw * 1e3,
                channels_last_ms=cl * 1e3,
                difference_ms=(nchw - cl) * 1e3,
                rule_bytes=nbytes,
                rule_at_copy_rate_ms=rule_s * 1e3,
            )
        )
        print(f"timed {name}", flush=True)
    profiles = profiles or {"nchw": Counter(), "channels_last": Counter()}
    names = set(profiles["nchw"]) | set(profiles["channels_last"])
    diff = sorted(
        ((profiles["nchw"][n] - profiles["channels_last"][n], n) for n in names), reverse=True
    )
    top = [
        dict(
            kernel=n,
            nchw_us=profiles["nchw"][n],
            channels_last_us=profiles["channels_last"][n],
            difference_us=d,
        )
        for d, n in diff[:25]
    ]
    totals = {k: sum(v.values()) for k, v in profiles.items()}
    Path(args.out).write_text(
        json.dumps(
            dict(
                environment=environment(),
                command=" ".join(sys.argv),
                rows=rows,
                resnet50_kernel_totals_us=totals,
                resnet50_top_kernels=top,
            ),
            indent=1,
        )
    )
    print(
        f"\nResNet-50 kernel time a step (us): NCHW {totals['nchw']:.0f}, channels_last "
        f"{totals['channels_last']:.0f}"
    )
    print(f"{'difference us':>14} {'NCHW us':>9} {'CL us':>9}  kernel")
    for r in top:
        print(
            f"{r['difference_us']:14.0f} {r['nchw_us']:9.0f} {r['channels_last_us']:9.0f}  "
            f"{r['kernel']}"
        )
    print(
        f"\n{'workload':52} {'NCHW ms':>8} {'CL ms':>8} {'diff ms':>8} {'rule GB':>8} "
        f"{'rule@copy ms':>12}"
    )
    for r in rows:
        print(
            f"{r['workload']:52} {r['nchw_ms']:8.3f} {r['channels_last_ms']:8.3f} "
            f"{r['difference_ms']:8.3f} {r['rule_bytes'] / 1e9:8.2f} "
            f"{r['rule_at_copy_rate_ms']:12.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
