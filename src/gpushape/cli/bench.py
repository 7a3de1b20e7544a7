"""`gpushape bench MODEL`: time the model's training step on the GPU, against variants, or
fix by fix with the audit's predictions beside the measurements.

    gpushape bench resnet50 --vs channels-last,compile,optimize+graph
    gpushape bench hf:gpt2 --optimize --csv results/loop.csv --plot gpt2.png
    gpushape bench hf:bert --optimize --mode compile

Synthetic data on the device (token ids over the vocabulary, labels for the model's task); the
optimizer as PyTorch builds it by default (`--optimizer`). Variants run in one process,
alternating; the table gives medians and quantiles, samples and tokens per second, the ratio
to the baseline, warm-up (compile) time, peak memory, kernels per step, GPU busy time, MFU
and whether the step is host- or GPU-bound. `--device cpu` runs the plumbing on the CPU: its
times say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from ..errors import GpushapeError
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
        "optimize-compile, fused-optimizer, compile, compile-max-autotune, graph, or several "
        "joined by '+' (optimize+graph)",
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
    p.add_argument("--csv", metavar="FILE", help="append a row per variant (or fix) to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="write a plot of the result")
    p.add_argument("-o", "--output", metavar="FILE.json", help="write the full result as JSON")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    check_model_options(args)
    if args.optimize and args.vs:
        raise GpushapeError("--optimize measures the fixes one by one; drop --vs, or run twice")
    if args.optimize and args.mode == "graph":
        raise GpushapeError(
            "--optimize runs in --mode eager or compile (the loop adds cuda-graphs as a fix)"
        )
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
    if args.vs:
        from ..steps import parse_variant

        for v in [args.baseline, *args.vs.split(",")]:
            parse_variant(v)


def _progress(text: str) -> None:
    print(f"gpushape: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..steps import bench, loop
    from ..steps import results as res

    _check(args)
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
    console = Console(emoji=False, highlight=False)
    if not console.is_terminal:  # a file or a pipe: the whole table, not an 80-column squeeze
        console = Console(emoji=False, highlight=False, width=160)
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
            **common,
        )
        with to_stdout():
            res.bench_table(result, console)
        data = result.to_dict()
        if args.csv:
            res.append_csv(args.csv, res.bench_rows(result), res.BENCH_COLUMNS)
        if args.plot:
            res.plot_bench(result, args.plot)
    if args.output:
        write_text(args.output, json.dumps(data, indent=1, default=str) + "\n")
    return 0


def _environment() -> dict:
    from ..bench import environment

    return environment()
