"""`gpushape audit MODEL`: trace the model (meta device: no memory, no compute), cost every op
on a GPU's roofline, run the audit rules, and print the findings (largest saving first) and the
top layers, as a table, schema-1 JSON, Markdown or a self-contained HTML page.

Options that contradict each other are errors, never silently dropped: --batch with --input,
--profile with --no-profile, --top with JSON (which lists every layer), a --format that the
-o file's extension contradicts. Without --format, -o FILE picks it from the extension.

Exit codes: 0 done; 1 a finding reached --fail-on (for CI gates; each named on stderr); 2 bad
usage, bad input or a missing environment."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from ..errors import GpushapeError
from .output import check_file, to_stdout, write_text

DTYPES = ("fp32", "tf32", "fp16", "bf16")
FORMATS = ("table", "json", "md", "html")
EXTENSIONS = {".html": "html", ".htm": "html", ".json": "json", ".md": "md", ".markdown": "md"}
DEFAULT_TOP = {"table": 15, "md": 20, "html": 40}
FAIL_LISTED = 8  # findings named on the --fail-on line; the rest counted


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="X-ray a model: per-layer FLOPs, bytes and roofline time on a GPU",
        description="Trace MODEL once on the meta device (no weights in memory, no compute), "
        "cost every aten op on the GPU's roofline, and show the layers that take "
        "the most predicted time. FLOPs count a multiply-add as 2.",
    )
    add_model_options(p)
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="output format (default: from the -o extension: .html/.htm, .json, .md, else "
        "table); html is one self-contained page with a roofline plot",
    )
    p.add_argument(
        "--fail-on",
        metavar="SEVERITY",
        help="exit 1 when a finding reaches this severity: high, medium or low",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE")
    p.add_argument(
        "--all",
        action="store_true",
        dest="show_all",
        help="also show info findings (savings below 0.1%% of the step, or none on this chip); "
        "JSON always lists every finding",
    )
    p.add_argument(
        "--top",
        type=int,
        help="modules in the table, layers in Markdown and HTML (default 15, 20, 40); "
        "JSON lists every layer",
    )
    p.add_argument(
        "--optimizer",
        choices=("none", "auto", "sgd", "adamw", "adamw-fused"),
        default="none",
        help="with --train: the optimizer the step runs, as `gpushape bench` builds it (auto: "
        "SGD with momentum for image models, AdamW for the rest); its step's GPU work is in "
        "the predicted step, and optimizer-not-fused can fire (default: none)",
    )
    p.set_defaults(func=run)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """MODEL and what to audit it as: shared by `audit` and `optimize`."""
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a zoo name (resnet50, resnet50-gpu, bert-base, gpt2, vit-b16, llama-7b), "
        "path/to/file.py:factory, package.module:factory, hf:<model type or config.json> "
        "or timm:<name>",
    )
    p.add_argument(
        "--gpu",
        help="target GPU, a catalog name (default: the GPU present when the catalog has it, else "
        "h100; with --profile, the chip it was measured on)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="a calibrated profile from `gpushape probe` (default: the one shipped "
        "for the chip, if any: the H100's and the H200's)",
    )
    p.add_argument(
        "--no-profile",
        action="store_true",
        help="use datasheet numbers even where a calibrated profile ships",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="bf16",
        help="model dtype and math: tf32 = fp32 tensors with TF32 matmuls (default: bf16)",
    )
    p.add_argument(
        "--batch", type=int, help="batch size (default: the zoo model's; not with --input)"
    )
    p.add_argument(
        "--train", action="store_true", help="cost a training step: forward and backward"
    )
    p.add_argument(
        "--input",
        action="append",
        metavar="SHAPE[:DTYPE]",
        help="an example input, e.g. 8x3x224x224 or 8x512:int64 (repeat for "
        "several); replaces the model's own",
    )
    p.add_argument(
        "--mode",
        choices=("eager", "compile", "graph"),
        default="eager",
        help="how the model will run: eager (default), compile (torch.compile: what Inductor "
        "does itself saves nothing) or graph (replayed from a CUDA graph)",
    )
    p.add_argument(
        "--device",
        default="meta",
        help="where to trace: meta (default: shapes only), cpu (real tensors, for models that "
        "read values) or cuda",
    )


def _torch_dtype(name: str):
    import torch

    return {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
    }[name]


def _flags(dtype: str):
    """fp32: TF32 off for matmuls and convolutions; tf32: on for both; half: as this process."""
    from ..auditing.context import BackendFlags

    if dtype == "fp32":
        return BackendFlags(matmul_tf32=False, cudnn_tf32=False)
    if dtype == "tf32":
        return BackendFlags(matmul_tf32=True, cudnn_tf32=True)
    return BackendFlags.current()


def _fail_on(text: str | None):
    from ..auditing.finding import Severity

    if text is None:
        return None
    try:
        severity = Severity.parse(text)
    except ValueError:
        raise GpushapeError(
            f"--fail-on: unknown severity {text!r}; use high, medium or low"
        ) from None
    if severity == Severity.INFO:
        raise GpushapeError("--fail-on: info findings never fail a run; use high, medium or low")
    return severity


def output_format(fmt: str | None, output: str | None) -> str:
    """--format, or the one -o's extension names, or table; an error when the two disagree."""
    implied = EXTENSIONS.get(Path(output).suffix.lower()) if output else None
    if fmt and implied and fmt != implied:
        raise GpushapeError(
            f"--format {fmt} contradicts -o {output!r}, whose extension means {implied}; "
            f"drop --format or rename the file"
        )
    return fmt or implied or "table"


def check_model_options(args: argparse.Namespace) -> None:
    """The model options that contradict each other (`add_model_options`)."""
    if args.profile and args.no_profile:
        raise GpushapeError("--profile and --no-profile contradict each other; keep one")
    if args.batch is not None and args.input:
        raise GpushapeError(
            "--batch does not apply with --input: the inputs' leading dimension is the batch"
        )


def check_options(args: argparse.Namespace) -> str:
    """Fail on contradicting or bad options before any work; the output format."""
    check_model_options(args)
    fmt = output_format(args.format, args.output)
    if getattr(args, "optimizer", "none") != "none" and not args.train:
        raise GpushapeError("--optimizer applies to a training step: add --train")
    if args.top is not None and fmt == "json":
        raise GpushapeError("--top does not apply to JSON, which lists every layer; drop --top")
    if args.top is not None and args.top < 1:
        raise GpushapeError(f"--top must be at least 1, got {args.top}")
    _fail_on(args.fail_on)
    if args.output:
        check_file(args.output)
    return fmt


def resolve(args: argparse.Namespace):
    """(the target chip, the resolved model) the model options name; a bad GPU or profile
    fails before the model is built."""
    from ..auditing.target import AUTO, resolve_target
    from ..models.resolve import resolve_model

    target = resolve_target(
        args.gpu, None if args.no_profile else (args.profile or AUTO), flag="--gpu"
    )
    resolved = resolve_model(
        args.model,
        batch=args.batch,
        dtype=_torch_dtype(args.dtype),
        device=args.device,
        inputs=args.input,
    )
    return target, resolved


def build_report(args: argparse.Namespace):
    """Resolve, trace, cost and audit the model the arguments name: an `audit.report.Report`."""
    from ..auditing.api import audit
    from ..tracing.recorder import reporting

    target, resolved = resolve(args)
    with reporting(_TraceProgress(resolved.name)):
        return audit(
            resolved.model,
            resolved.example_inputs,
            target,
            dtype=None,
            train=args.train,
            optimizer=_optimizer(args, resolved),
            flags=_flags(args.dtype),
            name=resolved.name,
            device=args.device,
            mode=args.mode,
        )


_LONG_TRACE = (
    " (a forward that loops in Python, over a sequence for one, is traced step by step; a"
    " smaller input traces faster)"
)


class _TraceProgress:
    """A line on stderr as a long trace passes 50,000 ops, then each time it doubles."""

    def __init__(self, name: str) -> None:
        self.name, self.next = name, 0

    def __call__(self, ops: int, phase: str) -> None:
        if ops < self.next:
            return
        hint = "" if self.next else _LONG_TRACE
        self.next = 2 * ops
        print(f"gpushape: tracing {self.name}: {ops:,} ops so far, {phase}{hint}",
              file=sys.stderr, flush=True)  # fmt: skip


def _optimizer(args: argparse.Namespace, resolved):
    """The optimizer `--optimizer` names, built over the model's parameters as bench builds
    it; None for "none"."""
    kind = getattr(args, "optimizer", "none")
    if kind == "none" or not args.train:
        return None
    from ..steps.batch import synthetic_batch
    from ..steps.step import make_optimizer

    batch = synthetic_batch(resolved.model, resolved.example_inputs)
    return make_optimizer(resolved.model, batch, kind)


def run(args: argparse.Namespace) -> int:
    fmt = check_options(args)
    fail_on = _fail_on(args.fail_on)
    report = build_report(args)
    top = args.top or DEFAULT_TOP.get(fmt, 0)
    if fmt == "json":
        text = report.to_json() + "\n"
    elif fmt == "md":
        text = report.to_markdown(top=top, show_all=args.show_all) + "\n"
    elif fmt == "html":
        text = report.to_html(top=top, show_all=args.show_all)
    elif args.output:
        text = _table_text(report, top, args.show_all)
    else:
        with to_stdout():
            report.render(top=top, show_all=args.show_all)
        text = None
    if text is not None:
        _emit(text, args.output)
    failing = [] if fail_on is None else [f for f in report.findings if f.severity >= fail_on]
    if failing:
        print(fail_summary(failing, fail_on, report.totals.roofline_time_s), file=sys.stderr)
        return 1
    return 0


def _table_text(report, top: int, show_all: bool = False) -> str:
    """The terminal report as plain text (no colour codes), for a file."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=140, force_terminal=False, color_system=None, emoji=False)
    report.render(console, top=top, show_all=show_all)
    return buffer.getvalue()


def fail_summary(failing: list, fail_on, step_s: float) -> str:
    """One stderr line naming the findings that failed the run, largest saving first."""
    from ..auditing.report.render import module_text, ordered

    shown = ordered(failing)
    names = ", ".join(
        f"{f.rule}@{module_text(f)} ({f.severity.label}, {_saving(f, step_s)})"
        for f in shown[:FAIL_LISTED]
    )
    more = f", and {len(shown) - FAIL_LISTED} more" if len(shown) > FAIL_LISTED else ""
    count = f"{len(shown)} finding{'s' if len(shown) != 1 else ''}"
    return f"gpushape: {count} at or above {fail_on.label} (--fail-on): {names}{more}"


def _saving(finding, step_s: float) -> str:
    """'0.021 ms', or what a finding without a time saving frees ('1.2 GB')."""
    from ..auditing.report.render import saving_text

    if finding.est_saving_s is None:
        return saving_text(finding, step_s)
    return f"{finding.est_saving_s * 1e3:,.3f} ms"


def _emit(text: str, path: str | None) -> None:
    if path is None:
        with to_stdout():
            sys.stdout.write(text)
        return
    write_text(path, text)
    print(f"gpushape: wrote {path}", file=sys.stderr)
