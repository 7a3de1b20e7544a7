"""The design guide's "GPU-optimized ResNet" (its section 4.2) against ResNet-50, both as the
same variant (by default channels_last under torch.compile), timed alternately in one process:
images per second, forward GMACs per image (torch's FlopCounterMode), parameters, and each
model's loss over the first steps from its own initial weights on the same fixed batch (the
two are different networks: whether the wider one learns as well is for a real data set;
this only shows both train).

    python benchmarks/steps/guide_resnet.py --batch 256 --out $OUT/guide_resnet.json
    python benchmarks/steps/guide_resnet.py --device cpu --batch 2 --image 32 --rounds 1  # plumbing
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gpushape.bench import write_results
from gpushape.models import create_model
from gpushape.steps import synthetic_batch
from gpushape.steps.loss_check import record_curve
from gpushape.steps.measure import time_blocks, warm
from gpushape.steps.variants import build_variant

MODELS = ("resnet50", "resnet50-gpu")


def forward_gmacs(name: str, image: int) -> float:
    model, (x,) = create_model(name, batch=1, image_size=image)  # meta: counts, no memory
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return counter.get_total_flops() / 2 / 1e9


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="guide_resnet.json")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--variant", default="channels-last+compile")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--loss-steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    runs, rows = {}, {}
    for name in MODELS:
        torch.manual_seed(0)
        model, inputs = create_model(name, batch=args.batch, dtype=dtype, device=args.device,
                                     image_size=args.image)  # fmt: skip
        batch = synthetic_batch(model, inputs)
        curve = record_curve(
            build_variant(args.variant, model, batch).run, args.loss_steps, name
        )  # a build of its own: the timed one starts from the same weights
        variant = build_variant(args.variant, model, batch)
        warmup_s = variant.build_s + warm(variant.run, 3, cuda=args.device == "cuda")
        runs[name] = variant.run
        rows[name] = {
            "params": sum(p.numel() for p in model.parameters()),
            "forward_gmacs_per_image": forward_gmacs(name, args.image),
            "warmup_s": warmup_s,
            "loss_first": curve.losses[0],
            "loss_last": curve.end(),
            "losses": list(curve.losses),
        }
        print(f"{name}: built and warmed up in {warmup_s:.1f} s", flush=True)
    times = time_blocks(runs, rounds=args.rounds, block=args.block, cuda=args.device == "cuda")
    for name, t in times.items():
        median = statistics.median(t)
        rows[name].update(step_times_s=t, median_s=median, images_per_s=args.batch / median)
    base, guide = rows[MODELS[0]], rows[MODELS[1]]
    ratios = {
        "images_per_s": guide["images_per_s"] / base["images_per_s"],
        "forward_gmacs_per_image": guide["forward_gmacs_per_image"]
        / base["forward_gmacs_per_image"],
        "params": guide["params"] / base["params"],
    }
    print(f"\n{'model':14} {'img/s':>9} {'GMACs/img':>10} {'params M':>9} {'loss':>16}")
    for name, r in rows.items():
        loss = f"{r['loss_first']:.3g} -> {r['loss_last']:.3g}"
        print(f"{name:14} {r['images_per_s']:9,.0f} {r['forward_gmacs_per_image']:10.2f} "
              f"{r['params'] / 1e6:9.1f} {loss:>16}")  # fmt: skip
    macs = ratios["forward_gmacs_per_image"]
    print(f"resnet50-gpu / resnet50: {ratios['images_per_s']:.2f}x the images per second at "
          f"{macs:.2f}x the MACs ({args.variant}, batch {args.batch})")  # fmt: skip
    write_results(
        args.out,
        results={
            "variant": args.variant,
            "batch": args.batch,
            "image": args.image,
            "models": rows,
            "guide_over_resnet50": ratios,
        },
    )


if __name__ == "__main__":
    main()
