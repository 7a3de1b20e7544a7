"""Does the input pipeline keep a ResNet-50 training step fed? Four ways of feeding one model.

    python benchmarks/data/bench_input_pipeline.py [--out input_pipeline.json] [--batch 256]
        [--images 20000] [--steps 100] [--warmup 10] [--seconds 40] [--data-dir DIR]
    python benchmarks/data/bench_input_pipeline.py --smoke   (CPU, tiny: checks that it runs)

One training step: ResNet-50 (torchvision's when it imports, else gpushape's zoo model, the same
network), channels_last, bf16 autocast, SGD with momentum, cross-entropy. It is fed by:
  synthetic  one batch already on the GPU, normalised bf16 channels_last: the ceiling
  prefetch   JPEG files (synthetic_images, 224x224, written here in parallel) decoded by
             DataLoader workers with recommend_loader's settings (target: the synthetic step),
             CUDAPrefetcher with GPU-side cast + normalise + channels_last
  naive      the same files, num_workers=0, no pinning, normalised on the CPU in float32,
             blocking .to(device)
  shard      the same images pre-decoded into one uint8 shard (memory-mapped), recommended
             settings and the prefetcher: the fix when JPEG decoding cannot keep up
Each variant runs `warmup` + `steps` steps (fewer when it reaches --seconds of wall time). Step
time: CUDA events between consecutive step ends, so it includes the GPU's idle time waiting for
data; img/s is batch / the median step. Each variant is reported as a fraction of the synthetic
throughput, with the host's wait for the next batch and the stall (step - synthetic step).
Writes the JSON (environment, command, criteria, rows) to --out and prints the table last.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.bench import write_results  # noqa: E402
from gpushape.data import cores_available  # noqa: E402
from gpushape.errors import GpushapeError, NoCudaError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its feeds, beside this
from _pipeline_feeds import (  # noqa: E402
    naive_batches,
    prepare_data,
    recommended_batches,
    synthetic_batches,
)

TARGET = 0.95  # fraction of the synthetic ceiling that counts as "kept up"
SMOKE = {"batch": 4, "images": 48, "image_size": 32, "shard_images": 24, "steps": 3, "warmup": 1}


def build_model(device: torch.device, smoke: bool, classes: int) -> tuple[torch.nn.Module, str]:
    """ResNet-50 (tiny in smoke mode) in float32, channels_last, training mode."""
    if smoke:
        from gpushape.models import create_model

        model, _ = create_model(
            "resnet50",
            dtype=torch.float32,
            device=device,
            blocks=(1, 1, 1, 1),
            width=8,
            num_classes=classes,
        )
        name = "gpushape resnet50 (tiny: 1 block per stage, width 8)"
    else:
        try:
            import torchvision

            model, name = torchvision.models.resnet50().to(device), "torchvision resnet50"
        except ImportError:
            from gpushape.models import create_model

            model, _ = create_model("resnet50", dtype=torch.float32, device=device)
            name = "gpushape resnet50"
    return model.to(memory_format=torch.channels_last).train(), name


class Trainer:
    """One SGD training step under bf16 autocast (on CUDA), and the timing of a run of them."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def run(self, batches, warmup: int, steps: int, seconds: float) -> dict:
        """Steps fed from `batches`: per-step times (s) after warm-up and the host's data waits."""
        cuda = self.device.type == "cuda"
        source, marks, waits = iter(batches), [], []
        start = time.perf_counter()
        for k in range(warmup + steps):
            before = time.perf_counter()
            x, y = next(source)
            wait = time.perf_counter() - before
            self.step(x, y)
            if k >= warmup - 1:
                marks.append(_mark(cuda))
                waits.append(wait)
            if time.perf_counter() - start > seconds:
                break
        if cuda:
            torch.cuda.synchronize(self.device)
            times = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]
        else:
            times = [b - a for a, b in itertools.pairwise(marks)]
        _close(source)
        return {"times": times, "waits": waits[1:], "wall_s": time.perf_counter() - start}


def _mark(cuda: bool):
    if not cuda:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _close(source) -> None:
    if hasattr(source, "close"):
        source.close()  # a generator: its DataLoader iterator (and workers) go with it
    del source
    gc.collect()


def summarize(name: str, what: str, run: dict, batch: int, args) -> dict:
    times, waits = run["times"], run["waits"]
    median = statistics.median(times) if times else float("nan")
    return {
        "variant": name,
        "description": what,
        "steps": len(times),
        "warmup": args.warmup,
        "capped": len(times) < args.steps,
        "median_step_ms": median * 1e3,
        "img_per_s": batch / median if times else 0.0,
        "img_per_s_mean": batch * len(times) / sum(times) if times else 0.0,
        "data_wait_ms_median": statistics.median(waits) * 1e3 if waits else None,
        "data_wait_ms_mean": statistics.fmean(waits) * 1e3 if waits else None,
        "wall_s": run["wall_s"],
    }


def add_fractions(rows: list[dict]) -> None:
    """Each row against the synthetic ceiling: fraction, stall per step, kept up or input-bound."""
    ceiling = next(r for r in rows if r["variant"] == "synthetic")
    for row in rows:
        fraction = row["img_per_s"] / ceiling["img_per_s"]
        row["fraction_of_synthetic"] = fraction
        row["stall_ms_per_step"] = max(row["median_step_ms"] - ceiling["median_step_ms"], 0.0)
        row["kept_up"] = fraction >= TARGET
        row["input_bound_by"] = max(1.0 - fraction, 0.0)


def criteria(rows: list[dict]) -> list[dict]:
    by = {r["variant"]: r for r in rows}

    def at_least(name: str, text: str) -> dict:
        value = by[name]["fraction_of_synthetic"] if name in by else None
        verdict = "SKIPPED" if value is None else "PASS" if value >= TARGET else "FAIL"
        return {"criterion": text, "value": value, "target": TARGET, "verdict": verdict}

    out = [
        at_least("prefetch", "prefetcher + recommended >= 95% of synthetic"),
        at_least("shard", "pre-decoded shard + prefetcher >= 95% of synthetic"),
    ]
    if "prefetch" in by and "naive" in by:
        ratio = by["prefetch"]["img_per_s"] / max(by["naive"]["img_per_s"], 1e-9)
        out.append(
            {
                "criterion": "prefetcher + recommended faster than naive",
                "value": ratio,
                "target": 1.0,
                "verdict": "PASS" if ratio > 1.0 else "FAIL",
            }
        )
    return out


def print_table(rows: list[dict], checks: list[dict], setup: dict) -> None:
    print(
        f"\nResNet-50 training, batch {setup['batch']}, {setup['model']} on {setup['device']}, "
        f"{setup['cores']} cores; {setup['images']} {setup['image_format']} images written in "
        f"{setup['write_images_s']:.1f} s; whole run {setup['total_s']:.0f} s"
    )
    print(
        f"{'variant':<10} {'img/s':>9} {'of synth':>9} {'step ms':>9} {'wait ms':>8} "
        f"{'stall ms':>9} {'steps':>6}  kept up"
    )
    for r in rows:
        wait = r["data_wait_ms_median"]
        print(
            f"{r['variant']:<10} {r['img_per_s']:>9.0f} {r['fraction_of_synthetic']:>9.1%} "
            f"{r['median_step_ms']:>9.1f} {wait if wait is not None else float('nan'):>8.1f} "
            f"{r['stall_ms_per_step']:>9.1f} {r['steps']:>6}  "
            f"{'yes' if r['kept_up'] else 'no'}{' (capped)' if r['capped'] else ''}"
        )
    for c in checks:
        value = "-" if c["value"] is None else f"{c['value']:.3f}"
        print(f"{c['verdict']:<7} {c['criterion']}: {value} (target {c['target']})")


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="input_pipeline.json")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--images", type=int, default=20000, help="JPEG files written")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--shard-images", type=int, default=4096, help="images in the shard")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=40.0, help="wall cap per variant")
    parser.add_argument("--variants", default="synthetic,prefetch,naive,shard")
    parser.add_argument("--data-dir", help="where the images go (kept); default: a temp dir")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run: checks it works")
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.classes = min(args.classes, 4)
    args.warmup = max(args.warmup, 1)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        raise NoCudaError("this benchmark measures a GPU; on a CPU machine run it with --smoke")
    if args.smoke:
        torch.set_num_threads(1)  # a tiny model: intra-op threads only wait on each other
    start = time.perf_counter()
    root = Path(args.data_dir or tempfile.mkdtemp(prefix="gpushape-pipeline-"))
    try:
        files, shard, setup = prepare_data(args, root)  # before CUDA starts: workers fork clean
        device = torch.device("cuda" if cuda else "cpu")
        torch.backends.cudnn.benchmark = True
        model, name = build_model(device, args.smoke, num_classes(args))
        setup.update(
            model=name,
            device=torch.cuda.get_device_name() if cuda else "cpu",
            batch=args.batch,
            cores=cores_available(),
        )
        rows = run_variants(args, Trainer(model, device), files, shard, device)
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    add_fractions(rows)
    checks = criteria(rows)
    setup["total_s"] = time.perf_counter() - start
    write_results(args.out, rows, criteria=checks, setup=setup, config=vars(args))
    print_table(rows, checks, setup)
    return 0


def num_classes(args) -> int:
    return args.classes if args.smoke else 1000


def run_variants(args, trainer: Trainer, files, shard, device: torch.device) -> list[dict]:
    """Synthetic first (its step is the loaders' target) and again last: the faster run is the
    ceiling, so a GPU that slows down over the run does not flatter the loaders."""
    wanted = set(args.variants.split(","))
    run = lambda batches: trainer.run(batches, args.warmup, args.steps, args.seconds)
    first = run(synthetic_batches(args, device, num_classes(args)))
    target = statistics.median(first["times"])
    rows = []
    for name, dataset in (("prefetch", files), ("shard", shard)):
        if name in wanted:
            rows.append(recommended_row(name, dataset, args, device, target, run))
            gc.collect()  # the loader and its workers go before the next variant
    if "naive" in wanted:
        what = "image files, num_workers=0, pageable, CPU normalise, blocking copy"
        rows.append(
            summarize("naive", what, run(naive_batches(files, args, device)), args.batch, args)
        )
    last = run(synthetic_batches(args, device, num_classes(args)))
    ceiling = min((first, last), key=lambda r: statistics.median(r["times"]))
    what = "one batch already on the GPU (the ceiling: the faster of a first and a last run)"
    row = summarize("synthetic", what, ceiling, args.batch, args)
    row["img_per_s_runs"] = [args.batch / statistics.median(r["times"]) for r in (first, last)]
    order = ["synthetic", "prefetch", "naive", "shard"]
    return sorted([row, *rows], key=lambda r: order.index(r["variant"]))


def recommended_row(name: str, dataset, args, device: torch.device, target: float, run) -> dict:
    batches, advice = recommended_batches(dataset, args, device, target)
    kind = "image files decoded" if name == "prefetch" else "pre-decoded uint8 shard"
    what = f"{kind} by {advice.num_workers} workers (recommended), prefetcher, GPU normalise"
    return {
        **summarize(name, what, run(batches), args.batch, args),
        "loader": advice.loader_kwargs(),
        "load_ms_per_batch": advice.load_s_per_batch * 1e3,
        "reasoning": list(advice.reasoning),
    }


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        raise SystemExit(main())
    except GpushapeError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
