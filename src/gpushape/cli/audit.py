"""`gpushape audit MODEL`: trace the model (meta device: no memory, no compute), cost every op
on a GPU's roofline, print the top layers and the totals (or schema-1 JSON)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import GpushapeError
from ..hardware import get_gpu

DTYPES = ("fp32", "tf32", "fp16", "bf16")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit", help="X-ray a model: per-layer FLOPs, bytes and roofline time on a GPU",
        description="Trace MODEL once on the meta device (no weights in memory, no compute), "
                    "cost every aten op on the GPU's roofline, and show the layers that take "
                    "the most predicted time. FLOPs count a multiply-add as 2.")
    p.add_argument("model", metavar="MODEL",
                   help="a zoo name (resnet50, bert-base, gpt2, vit-b16, llama-7b), "
                        "path/to/file.py:factory or package.module:factory")
    p.add_argument("--gpu", default="h100", help="target GPU, a catalog name (default: h100)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16",
                   help="model dtype and math: tf32 = fp32 tensors with TF32 matmuls "
                        "(default: bf16)")
    p.add_argument("--batch", type=int, help="batch size (default: the zoo model's)")
    p.add_argument("--train", action="store_true",
                   help="cost a training step: forward and backward")
    p.add_argument("--input", action="append", metavar="SHAPE[:DTYPE]",
                   help="an example input, e.g. 8x3x224x224 or 8x512:int64 (repeat for "
                        "several); replaces the model's own")
    p.add_argument("--device", default="meta",
                   help="where to trace: meta (default: shapes only) or cpu (real tensors, "
                        "for models that read values)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="output format (default: table)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE")
    p.add_argument("--top", type=int, default=15, help="modules shown in the table (default 15)")
    p.set_defaults(func=run)


def _torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}[name]


def build_report(args: argparse.Namespace):
    """Resolve, trace and cost the model the arguments name: an `audit.report.Report`."""
    from .. import cost, trace
    from ..audit.report import Report
    from ..models.resolve import resolve_model

    gpu = get_gpu(args.gpu)  # an unknown GPU fails before any work
    if args.top < 1:
        raise GpushapeError(f"--top must be at least 1, got {args.top}")
    resolved = resolve_model(args.model, batch=args.batch, dtype=_torch_dtype(args.dtype),
                             device=args.device, inputs=args.input)
    traced = trace(resolved.model, resolved.example_inputs, train=args.train,
                   device=args.device, name=resolved.name)
    return Report.from_cost(cost(traced, gpu, math=args.dtype), dtype=args.dtype)


def run(args: argparse.Namespace) -> int:
    report = build_report(args)
    if args.format == "json":
        _emit(report.to_json() + "\n", args.output)
        return 0
    if args.output:
        from rich.console import Console

        with _open(args.output) as fh:
            report.render(Console(file=fh, width=140, force_terminal=False), top=args.top)
        print(f"gpushape: wrote {args.output}", file=sys.stderr)
    else:
        report.render(top=args.top)
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
