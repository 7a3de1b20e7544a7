"""`gpushape audit MODEL`: trace the model (meta device: no memory, no compute), cost every op
on a GPU's roofline, run the audit rules, and print the findings (largest saving first) and the
top layers, as a table, schema-1 JSON, Markdown or a self-contained HTML page.

Exit codes: 0 done; 1 a finding reached --fail-on (for CI gates); 2 bad usage or bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import GpushapeError

DTYPES = ("fp32", "tf32", "fp16", "bf16")
FORMATS = ("table", "json", "md", "html")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="X-ray a model: per-layer FLOPs, bytes and roofline time on a GPU",
        description="Trace MODEL once on the meta device (no weights in memory, no compute), "
        "cost every aten op on the GPU's roofline, and show the layers that take "
        "the most predicted time. FLOPs count a multiply-add as 2.",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a zoo name (resnet50, bert-base, gpt2, vit-b16, llama-7b), "
        "path/to/file.py:factory or package.module:factory",
    )
    p.add_argument(
        "--gpu",
        help="target GPU, a catalog name (default: h100, or the chip a --profile was measured on)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="a calibrated profile from `gpushape probe` (default: the one shipped "
        "for the chip, if any: the H200's)",
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
    p.add_argument("--batch", type=int, help="batch size (default: the zoo model's)")
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
        "--device",
        default="meta",
        help="where to trace: meta (default: shapes only) or cpu (real tensors, "
        "for models that read values)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="output format (default: table); html is one self-contained page with a roofline plot",
    )
    p.add_argument(
        "--fail-on",
        metavar="SEVERITY",
        help="exit 1 when a finding reaches this severity: high, medium or low",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE")
    p.add_argument("--top", type=int, default=15, help="modules shown in the table (default 15)")
    p.set_defaults(func=run)


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


def build_report(args: argparse.Namespace):
    """Resolve, trace, cost and audit the model the arguments name: an `audit.report.Report`."""
    from ..auditing.api import audit
    from ..auditing.target import AUTO, resolve_target
    from ..models.resolve import resolve_model

    # Bad GPU, profile or severity fails before any work.
    target = resolve_target(args.gpu, None if args.no_profile else (args.profile or AUTO))
    _fail_on(args.fail_on)
    if args.top < 1:
        raise GpushapeError(f"--top must be at least 1, got {args.top}")
    resolved = resolve_model(
        args.model,
        batch=args.batch,
        dtype=_torch_dtype(args.dtype),
        device=args.device,
        inputs=args.input,
    )
    return audit(
        resolved.model,
        resolved.example_inputs,
        target,
        dtype=None,
        train=args.train,
        flags=_flags(args.dtype),
        name=resolved.name,
        device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    fail_on = _fail_on(args.fail_on)
    report = build_report(args)
    if args.format == "json":
        _emit(report.to_json() + "\n", args.output)
    elif args.format == "md":
        _emit(report.to_markdown(top=args.top) + "\n", args.output)
    elif args.format == "html":
        _emit(report.to_html(top=max(args.top, 40)), args.output)
    elif args.output:
        from rich.console import Console

        with _open(args.output) as fh:
            report.render(Console(file=fh, width=140, force_terminal=False), top=args.top)
        print(f"gpushape: wrote {args.output}", file=sys.stderr)
    else:
        report.render(top=args.top)
    if fail_on is not None and any(f.severity >= fail_on for f in report.findings):
        return 1
    return 0


def _open(path: str):
    try:
        return Path(path).open("w")
    except OSError as exc:
        raise GpushapeError(f"cannot write {path!r}: {exc.strerror or exc}") from exc


def _emit(text: str, path: str | None) -> None:
    if path is None:
        sys.stdout.write(text)
        return
    with _open(path) as fh:
        fh.write(text)
    print(f"gpushape: wrote {path}", file=sys.stderr)
