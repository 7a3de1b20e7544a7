"""Audit a CNN left in PyTorch's default NCHW layout, convert it to channels_last, audit again;
on a GPU, also time both training steps side by side.

    python examples/audit_channels_last.py [--gpu h200] [--batch 64] [--measure]

ResNet-50 from gpushape's zoo, bf16, training. The audit traces it on the meta device (no GPU
needed) and prices it on the target chip's calibrated roofline: in NCHW, cuDNN converts every
tensor-core convolution's tensors to NHWC and back, and BatchNorm and max pooling run slower
NCHW kernels (both measured on the H200 by `gpushape probe`). nchw-conv names the fix and what
it saves; after `model.to(memory_format=torch.channels_last)` (and the same for the input)
the finding is gone. With --measure on a CUDA machine, both training steps are replayed from
CUDA graphs, alternated, and their medians printed next to the prediction.
"""

from __future__ import annotations

import argparse

import torch

import gpushape
from gpushape.bench import compare, cuda_graph
from gpushape.models import create_model


def channels_last(model: torch.nn.Module, x: torch.Tensor):
    return (
        model.to(memory_format=torch.channels_last),
        x.contiguous(memory_format=torch.channels_last),
    )


def audit(title: str, model: torch.nn.Module, x: torch.Tensor, gpu: str) -> float:
    rep = gpushape.audit(
        model, (x,), gpu=gpu, dtype=torch.bfloat16, train=True, rules=["nchw-conv"]
    )
    step_ms = rep.totals.kernel_time_s * 1e3  # GPU time: what a CUDA-graph replay measures
    print(
        f"\n{title}: predicted {step_ms:.2f} ms of GPU time a training step on {rep.gpu} "
        f"(+{rep.totals.launch_s * 1e3:.2f} ms launching {rep.totals.kernels} kernels eagerly)"
    )
    for f in rep.findings:
        e = f.evidence
        print(
            f"  [{f.severity.name.lower()}] {f.rule} (saves {f.est_saving_s * 1e3:.2f} ms: "
            f"conversions {e['conversions_s'] * 1e3:.2f}, NCHW BatchNorm/pooling "
            f"{e['nchw_norm_pool_s'] * 1e3:.2f}): {f.message}"
        )
    if not rep.findings:
        print("  no nchw-conv finding")
    return step_ms


def measure(batch: int) -> tuple[float, float]:
    """Median ms of one training step in each layout on this GPU, from CUDA graphs."""
    steps, keep = {}, []
    for name in ("nchw", "channels_last"):
        model, (x,) = create_model("resnet50", batch=batch, device="cuda")
        if name == "channels_last":
            model, x = channels_last(model, x)
        params = list(model.parameters())
        gy = torch.randn(batch, 1000, device="cuda", dtype=torch.bfloat16)
        step = lambda model=model, x=x, params=params, gy=gy: torch.autograd.grad(
            model(x), params, gy
        )
        keep.append(step)
        steps[name] = cuda_graph(step)
    times = compare(steps, rounds=5, repeats_per_round=10, warmup=2)
    return times["nchw"].median_s * 1e3, times["channels_last"].median_s * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--measure",
        action="store_true",
        help="also time both layouts on this machine's GPU (needs CUDA)",
    )
    args = parser.parse_args(argv)
    if args.measure and not torch.cuda.is_available():
        parser.error("--measure needs a CUDA GPU; without it the audit alone runs")
    model, (x,) = create_model("resnet50", batch=args.batch)  # meta device: nothing allocated
    before = audit("NCHW", model, x, args.gpu)
    after = audit("channels_last", *channels_last(model, x), args.gpu)
    print(f"\npredicted: {before:.2f} -> {after:.2f} ms ({before / after:.2f}x)")
    if args.measure:
        nchw, cl = measure(args.batch)
        print(
            f"measured on {torch.cuda.get_device_name()}: {nchw:.2f} -> {cl:.2f} ms "
            f"({nchw / cl:.2f}x), CUDA-graph medians"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
