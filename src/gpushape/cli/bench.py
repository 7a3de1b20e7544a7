"""`gpushape bench MODEL`: time the model's training step on the GPU, against variants, or
fix by fix with the audit's predictions beside the measurements.

    gpushape bench resnet50 --vs channels-last,compile,optimize+graph
    gpushape bench hf:gpt2 --optimize --csv results/loop.csv --plot gpt2.png
    gpushape bench hf:bert --optimize --mode compile
    gpushape bench resnet50 --nproc 2 --csv results/ddp.csv     # DDP on two GPUs
    gpushape bench resnet50 --vs optimize+graph --loss-steps 30  # does it still train?

Synthetic data on the device (token ids over the vocabulary, labels for the model's task); the
optimizer as PyTorch builds it by default (`--optimizer`). Variants run in one process,
alternating; the table gives medians and quantiles, samples and tokens per second, the ratio
to the baseline, warm-up (compile) time, peak memory, kernels per step, GPU busy time, MFU
and whether the step is host- or GPU-bound. `--device cpu` runs the plumbing on the CPU: its
times say nothing about a GPU. `--nproc N` runs the step under DistributedDataParallel on N
GPUs through torchrun, against one GPU alone in the same run (`steps/distributed.py`).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from ..errors import GpushapeError, NoCudaError
from .audit import add_model_options, check_model_options, resolve
from .output import check_file, to_stdout, write_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time a model's training step: variants side by side, or each fix predicted "
        "beside measured (--optimize)",
        description=__doc__.splitlines()[0],
    )
    add_model_options(p)
    p.set_defaults(device="cuda", train=True)
    p.add_argument(
        "--vs",
        metavar="V[,V...]",
        help="variants to time against the baseline: eager, channels-last, optimize, "
        "optimize-compile, fused-optimizer, caller-backward, cudnn-benchmark, compile, "
        "compile-max-autotune, "
        "compile-graphs, graph, aten-random and tuned-kernels (compile options), "
        "or several joined by '+' (optimize+graph; compile+graph: the compiled step captured "
        "whole)",
    )
    p.add_argument("--baseline", default="eager", metavar="V", help="the baseline variant")
    p.add_argument(
        "--optimize",
        action="store_true",
        help="the loop: audit, apply the fixes one by one, measure each against its prediction "
        "(in --mode eager or compile)",
    )
    p.add_argument(
        "--optimizer",
        default="auto",
        choices=("auto", "sgd", "adamw", "adamw-fused"),
        help="auto: SGD with momentum for image models, AdamW for the rest, as PyTorch builds "
        "them by default",
    )
    p.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps (default 3)")
    p.add_argument(
        "--kernels",
        type=int,
        default=0,
        metavar="N",
        help="also print each variant's N longest kernels per step (GPU only; the JSON keeps 40)",
    )
    p.add_argument(
        "--loss-steps",
        type=int,
        default=0,
        metavar="N",
        help="first train each variant N steps from the model's weights on the fixed batch and "
        "say whether its loss falls like the baseline's (JSON and --plot keep the curves)",
    )
    p.add_argument("--csv", metavar="FILE", help="append a row per variant (or fix) to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="write a plot of the result")
    p.add_argument("-o", "--output", metavar="FILE.json", help="write the full result as JSON")
    _add_ddp_options(p)
    p.set_defaults(func=run, bench_parser=p)


def _add_ddp_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="time the step under DistributedDataParallel on N GPUs of this host (torchrun), "
        "against one GPU alone; several hosts: docs/bench.md",
    )
    p.add_argument(
        "--bucket-mb",
        type=_bucket_mb,
        default="auto",
        metavar="MB",
        help="DDP's gradient bucket size, or auto (the default): DDP timed with buckets of "
        "10, 25, 50 and 100 MB, the fastest kept. Larger buckets, fewer all-reduce calls; "
        "smaller, an earlier start during the backward",
    )
    p.add_argument(
        "--ddp-compress",
        choices=("none", "bf16"),
        default="none",
        help="all-reduce the gradients as bf16: half the bytes, which pays only where the "
        "links are slow (PCIe, Ethernet between hosts), not over NVLink",
    )
    p.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)


def _bucket_mb(text: str) -> str | float:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size in MB or auto, not {text!r}") from None


def _check(args: argparse.Namespace) -> None:
    check_model_options(args)
    if args.optimize and args.vs:
        raise GpushapeError("--optimize measures the fixes one by one; drop --vs, or run twice")
    if args.optimize and args.mode == "graph":
        raise GpushapeError(
            "--optimize runs in --mode eager or compile (the loop adds cuda-graphs as a fix)"
        )
    if args.loss_steps and args.optimize:
        raise GpushapeError(
            "--loss-steps compares --vs variants with the baseline; drop --optimize"
        )
    from ..steps.loss_check import MIN_STEPS

    if args.loss_steps and args.loss_steps < MIN_STEPS:
        raise GpushapeError(f"--loss-steps must be at least {MIN_STEPS}, got {args.loss_steps}")
    for name, value in (("--rounds", args.rounds), ("--steps", args.steps)):
        if value < 1:
            raise GpushapeError(f"{name} must be at least 1, got {value}")
    if args.warmup < 1:
        raise GpushapeError(f"--warmup must be at least 1, got {args.warmup}")
    if args.device == "meta":
        raise GpushapeError("bench runs the model: --device cuda (the default) or cpu")
    if args.output and not args.output.endswith(".json"):
        raise GpushapeError(f"-o writes JSON: name the file *.json, not {args.output!r}")
    if args.plot and not args.plot.endswith((".png", ".svg", ".pdf")):
        raise GpushapeError("--plot writes an image: name it *.png, *.svg or *.pdf")
    for path in (args.output, args.csv, args.plot):
        if path:
            check_file(path)
    _check_ddp(args)
    if args.vs:
        from ..steps import parse_variant

        for v in [args.baseline, *args.vs.split(",")]:
            parse_variant(v)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise NoCudaError(
                "bench times the training step on a GPU and torch sees none here: `gpushape "
                "audit` predicts it without one; --device cpu checks the plumbing only"
            )


def _check_ddp(args: argparse.Namespace) -> None:
    ddp = args.nproc > 1 or args.ddp_worker
    if args.nproc < 1:
        raise GpushapeError(f"--nproc must be at least 1, got {args.nproc}")
    if args.ddp_worker and args.nproc > 1:
        raise GpushapeError(
            "--ddp-worker is one rank; torchrun's --nproc-per-node sets how many: drop --nproc"
        )
    if args.bucket_mb != "auto" and args.bucket_mb <= 0:
        raise GpushapeError(f"--bucket-mb must be above 0, got {args.bucket_mb:g}")
    if not ddp and (args.ddp_compress != "none" or args.bucket_mb != "auto"):
        raise GpushapeError("--bucket-mb and --ddp-compress apply to DDP: add --nproc N (N > 1)")
    if not ddp:
        return
    for flag, given in (
        ("--optimize", args.optimize),
        ("--vs", args.vs),
        ("--plot", args.plot),
        ("--loss-steps", args.loss_steps),
        ("--baseline", args.baseline != "eager"),
    ):
        if given:
            raise GpushapeError(
                f"--nproc times the step as given, alone and under DDP; drop "
                f"{flag}, or run it without --nproc"
            )
    if args.nproc > 1 and args.device.startswith("cuda"):
        import torch

        visible = torch.cuda.device_count()
        if args.nproc > visible:
            raise GpushapeError(
                f"--nproc {args.nproc} needs {args.nproc} GPUs; this host has "
                f"{visible} visible: lower --nproc (several hosts: docs/bench.md)"
            )


def _progress(text: str) -> None:
    print(f"gpushape: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..steps import bench, loop
    from ..steps import results as res

    _check(args)
    if args.ddp_worker:
        return _ddp_worker(args)
    if args.nproc > 1:
        from ..steps.distributed import launch

        return launch(_argv(args), args.nproc)
    target, resolved = resolve(args)
    if args.device == "cpu":
        _progress("on the CPU: these times check the plumbing, they say nothing about a GPU")
    common = dict(
        name=resolved.name,
        optimizer=args.optimizer,
        rounds=args.rounds,
        block=args.steps,
        warmup=args.warmup,
        gpu=target,
        progress=_progress,
    )
    console = _console()
    if args.optimize:
        result = loop(resolved.model, resolved.example_inputs, mode=args.mode, **common)
        env = _environment()
        with to_stdout():
            res.loop_table(result, console)
        data = {"environment": env, **result.to_dict()}
        if args.csv:
            res.append_csv(args.csv, res.loop_rows(result, env), res.LOOP_COLUMNS)
        if args.plot:
            res.plot_loop(result, args.plot)
    else:
        variants = args.vs.split(",") if args.vs else []
        result = bench(
            resolved.model,
            resolved.example_inputs,
            variants=variants,
            baseline=args.baseline,
            loss_steps=args.loss_steps,
            **common,
        )
        with to_stdout():
            res.bench_table(result, console)
            if args.kernels:
                res.kernels_table(result, console, args.kernels)
        data = result.to_dict()
        if args.csv:
            res.append_csv(args.csv, res.bench_rows(result), res.BENCH_COLUMNS)
        if args.plot:
            res.plot_bench(result, args.plot)
    if args.output:
        write_text(args.output, json.dumps(data, indent=1, default=str) + "\n")
    return 0


def _console() -> Console:
    console = Console(emoji=False, highlight=False)
    if not console.is_terminal:  # a file or a pipe: the whole table, not an 80-column squeeze
        console = Console(emoji=False, highlight=False, width=160)
    return console


def _ddp_worker(args: argparse.Namespace) -> int:
    """One torchrun rank: the step alone and under DDP; rank 0 prints and writes."""
    from ..steps import distributed
    from ..steps import results as res

    args.device = distributed.worker_device(args.device)
    _, resolved = resolve(args)
    result = distributed.ddp_bench(
        resolved.model,
        resolved.example_inputs,
        bucket_mb=None if args.bucket_mb == "auto" else args.bucket_mb,
        compress=None if args.ddp_compress == "none" else args.ddp_compress,
        rounds=args.rounds,
        block=args.steps,
        warmup=args.warmup,
        optimizer=args.optimizer,
        name=resolved.name,
        progress=_progress,
    )
    if result.rank != 0:
        return 0
    with to_stdout():
        distributed.ddp_table(result, _console())
    if args.csv:
        res.append_csv(args.csv, res.bench_rows(result.as_bench()), res.BENCH_COLUMNS)
    if args.output:
        write_text(args.output, json.dumps(result.to_dict(), indent=1, default=str) + "\n")
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    """The bench command these arguments mean, option by option: what the workers rerun."""
    parser: argparse.ArgumentParser = args.bench_parser
    argv = ["bench"]
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            argv.append(str(value))  # MODEL
        elif value is None or value is False or value == parser.get_default(action.dest):
            continue  # not given (help's value is None)
        elif action.nargs == 0:  # a flag
            argv.append(max(action.option_strings, key=len))
        else:
            for item in value if isinstance(value, list) else [value]:
                argv.append(f"{max(action.option_strings, key=len)}={item}")
    return argv


def _environment() -> dict:
    from ..bench import environment

    return environment()
