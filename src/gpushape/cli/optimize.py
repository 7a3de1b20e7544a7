"""`gpushape optimize MODEL`: apply the audit's fixes and say what changed.

Prints the plan that ran: each transform applied (where, and what the audit predicted it saves),
what was refused and why, what was rolled back after failing the numeric check, which fixes
have no transform yet, and the predicted step before and after. On the meta device (the
default) the model is rewritten and audited but cannot be checked numerically; `--device cpu`
or `cuda` checks every rewrite (outputs and every parameter's gradient). `--bench` (with
`--device cuda`) optimizes a copy inside a training-step benchmark instead (`gpushape.steps`:
synthetic batch, the default optimizer, each rewrite checked on 2 samples) and times it against
the original in one run.
`-o FILE.json` writes the report as JSON.
"""

from __future__ import annotations

import argparse
import json
import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import GpushapeError
from .audit import _torch_dtype, add_model_options, check_model_options, resolve
from .output import check_file, to_stdout, write_text

SHOWN_MODULES = 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "optimize",
        help="apply the audit's fixes to a model, check them, report what changed",
        description=__doc__.splitlines()[0],
    )
    add_model_options(p)
    p.add_argument(
        "--transforms",
        metavar="A,B",
        help="apply these transforms (fix ids) instead of the ones the findings name",
    )
    p.add_argument("--memory-budget", metavar="SIZE", help="activation memory to fit, e.g. 40GB")
    p.add_argument(
        "--bench",
        action="store_true",
        help="time the original and the optimized training step (needs --device cuda)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the report as JSON to FILE")
    p.set_defaults(func=run)


def parse_size(text: str | None) -> int | None:
    """'40GB', '512MiB', '1e9' -> bytes."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?i?B)?\s*", text)
    if not match:
        raise GpushapeError(f"--memory-budget: cannot read {text!r}; write e.g. 40GB or 512MiB")
    value, unit = float(match.group(1)), (match.group(2) or "B").upper()
    base = 1024 if "I" in unit else 1000
    return int(value * base ** "BKMGT".index(unit[0]))


def _check(args: argparse.Namespace) -> None:
    check_model_options(args)
    if args.bench and args.device != "cuda":
        raise GpushapeError("--bench times steps on the GPU: add --device cuda")
    if args.bench and args.memory_budget:
        raise GpushapeError(
            "--bench times the fixes that save time; --memory-budget trades time for memory: "
            "run them apart"
        )
    if args.output:
        if not args.output.endswith(".json"):
            raise GpushapeError(f"-o writes JSON: name the file *.json, not {args.output!r}")
        check_file(args.output)


def run(args: argparse.Namespace) -> int:
    from ..transforms import optimize

    _check(args)
    budget = parse_size(args.memory_budget)
    target, resolved = resolve(args)
    transforms = args.transforms.split(",") if args.transforms else None
    if args.bench:  # optimized inside the benchmark, on a copy, and timed against the original
        report, bench = _bench(resolved.model, resolved.example_inputs, args, transforms, target)
        data = {**report.to_dict(), "bench": bench}
    else:
        _, report = optimize(
            resolved.model,
            resolved.example_inputs,
            target,
            train=args.train,
            dtype=_torch_dtype(args.dtype),
            mode=args.mode,
            memory_budget=budget,
            transforms=transforms,
        )
        data = report.to_dict()
    with to_stdout():
        render(report, data.get("bench"), resolved.name)
    if args.output:
        write_text(args.output, json.dumps(data, indent=1, default=str) + "\n")
    return 0


def _modules(names: list[str]) -> str:
    shown = ", ".join(n or "(model)" for n in names[:SHOWN_MODULES])
    more = f" and {len(names) - SHOWN_MODULES} more" if len(names) > SHOWN_MODULES else ""
    return shown + more


def render(report, bench: dict | None, name: str, console: Console | None = None) -> None:
    """The plan that ran, as a table, then the predicted (and measured) step."""
    console = console or Console(emoji=False, highlight=False)
    head = f"{name} on {report.gpu}, {report.mode} mode: {report.before.inputs or ''}"
    table = Table(title=escape(head), title_justify="left", show_lines=True)
    for column in ("transform", "what happened", "where"):
        table.add_column(column, overflow="fold")
    by_transform: dict[str, list] = {}
    for change in report.applied:
        by_transform.setdefault(change.transform, []).append(change)
    for tid, changes in by_transform.items():
        check = report.verified.get(tid)
        checked = "checked: outputs and gradients within the gate" if check else "not checked"
        if tid in report.measured:  # kept on a timing of what it changes (graph-layers)
            checked = "checked against eager from one seed"
        saving = report.predicted_saving_s.get(tid)
        predicted = f"; predicted {saving * 1e3:,.3f} ms a step" if saving else ""
        if tid in report.measured:
            before_s, after_s = report.measured[tid]
            predicted = f"; timed on this GPU: {before_s * 1e3:,.2f} -> {after_s * 1e3:,.2f} ms"
        what = f"applied at {len(changes)} place(s); {checked}{predicted}\n{changes[0].detail}"
        table.add_row(tid, escape(what), escape(_modules([c.module for c in changes])))
    for label, items in (
        ("rolled back", report.rolled_back),
        ("refused", report.refused),
        ("not applied", report.skipped),
    ):
        for r in items:
            table.add_row(r.transform, escape(f"{label}: {r.reason}"), escape(r.module or "-"))
    console.print(table)
    if report.applied and not report.verified:
        console.print(
            "not checked numerically: the model has no real weights here (meta device); "
            "--device cpu or cuda runs every rewrite against the original"
        )
    before, after = report.step_before_s * 1e3, report.step_after_s * 1e3
    console.print(f"predicted step: {before:,.3f} -> {after:,.3f} ms ({before / after:.2f}x)")
    if bench:
        console.print(
            f"measured step: {bench['original_ms']:,.3f} -> {bench['optimized_ms']:,.3f} ms "
            f"({bench['speedup']:.2f}x; training steps, medians of {bench['samples']} "
            "10-step blocks, alternated)"
        )


def _bench(original, inputs, args, transforms, target, rounds: int = 5, block: int = 10):
    """(the optimize report, the timings): the original's training step against a copy
    optimized in the benchmark (`gpushape.steps`: synthetic batch and loss, the default
    optimizer, each rewrite checked on 2 samples, variants alternated in rounds, CUDA-event
    medians), as `gpushape bench MODEL --vs optimize` times it."""
    from ..steps.batch import synthetic_batch
    from ..steps.run import measure_variants
    from ..steps.variants import Spec

    specs = {
        "original": Spec(),
        "optimized": Spec(
            optimize_mode="compile" if args.mode == "compile" else "eager",
            transforms=tuple(transforms) if transforms else None,
            runner="compile" if args.mode == "compile" else "eager",
        ),
    }
    if args.mode == "compile":
        specs["original"] = Spec(runner="compile")
    built, stats, failed = measure_variants(
        specs,
        original,
        synthetic_batch(original, inputs),
        optimizer="auto",
        gpu=target,
        rounds=rounds,
        block=block,
        warmup=min(3, block),
        profile=False,
    )
    if "optimized" in failed:
        raise GpushapeError(f"--bench: the optimized model failed to run: {failed['optimized']}")
    original_s, optimized_s = stats["original"].median_s, stats["optimized"].median_s
    return built["optimized"].optimize_report, {
        "original_ms": original_s * 1e3,
        "optimized_ms": optimized_s * 1e3,
        "speedup": original_s / optimized_s,
        "samples": len(stats["original"].step_times_s),
    }
