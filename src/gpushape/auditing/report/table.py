"""The audit report as a terminal table: layers grouped by module, top modules by time.

Model names and module paths are the user's text: they go into the table as `rich.text.Text`,
never parsed as markup (`[red]`) or emoji codes (`hf.py:llama:`), and the consoles made here
have emoji off for the lines that other modules print as strings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from .core import Layer, Report


@dataclass(frozen=True)
class ModuleRow:
    """All layers of one module (forward and backward together)."""

    module: str
    module_type: str
    ops: tuple[str, ...]  # short op names, most time first
    flops: int
    min_bytes: int
    roofline_time_s: float
    compute_bound_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_bound_s >= self.roofline_time_s / 2 else "memory"


def _short(op: str) -> str:
    """'aten.convolution_backward.default' -> 'convolution_backward'."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 else op


def module_rows(layers: Iterable[Layer]) -> list[ModuleRow]:
    by_module: dict[str, list[Layer]] = {}
    for layer in layers:
        by_module.setdefault(layer.module, []).append(layer)
    rows = []
    for module, members in by_module.items():
        members = sorted(members, key=lambda m: m.roofline_time_s, reverse=True)
        names = tuple(dict.fromkeys(_short(m.op) for m in members))
        rows.append(
            ModuleRow(
                module=module,
                module_type=members[0].module_type,
                ops=names,
                flops=sum(m.flops for m in members),
                min_bytes=sum(m.min_bytes for m in members),
                roofline_time_s=sum(m.roofline_time_s for m in members),
                compute_bound_s=sum(m.compute_bound_s for m in members),
            )
        )
    return sorted(rows, key=lambda r: r.roofline_time_s, reverse=True)


def _ops_text(ops: tuple[str, ...], limit: int = 2) -> str:
    text = ", ".join(ops[:limit])
    return text + (f" +{len(ops) - limit}" if len(ops) > limit else "")


def _cells(flops: int, nbytes: int, time_s: float, total_s: float) -> list[str]:
    intensity = flops / nbytes if nbytes else 0.0
    share = time_s / total_s if total_s else 0.0
    return [
        f"{flops / 1e9:,.3f}",
        f"{nbytes / 1e6:,.1f}",
        f"{intensity:,.1f}",
        f"{time_s * 1e3:,.3f}",
        f"{share:.1%}",
    ]


def _console() -> Console:
    """The terminal's width, or 120 columns when the output is not a terminal (a pipe, a file)."""
    probe = Console(emoji=False)
    return probe if probe.is_terminal else Console(width=120, emoji=False)


def render_table(report: Report, console: Any = None, *, top: int = 15) -> None:
    console = console or _console()
    step = "training step (forward + backward)" if report.train else "forward"
    table = Table(
        title=Text(
            f"{report.model}: {step} on {report.gpu_full_name} ({report.gpu}), "
            f"{report.dtype}; top {top} modules by predicted time",
            style="table.title",
        )
    )
    table.add_column("module", overflow="fold")
    table.add_column("op(s)", overflow="fold")
    for name in ("GFLOP", "MB", "FLOP/B"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("bound", no_wrap=True)
    table.add_column("predicted ms", justify="right", no_wrap=True)
    table.add_column("share %", justify="right", no_wrap=True)
    rows = module_rows(report.layers)
    total_s = report.totals.roofline_time_s
    for row in rows[:top]:
        name = row.module or f"(root {row.module_type})"
        flops, nbytes, inten, ms, share = _cells(
            row.flops, row.min_bytes, row.roofline_time_s, total_s
        )
        table.add_row(
            Text(name), Text(_ops_text(row.ops)), flops, nbytes, inten, row.bound, ms, share
        )
    rest = rows[top:]
    if rest:
        cells = _cells(
            sum(r.flops for r in rest),
            sum(r.min_bytes for r in rest),
            sum(r.roofline_time_s for r in rest),
            total_s,
        )
        table.add_row(f"... {len(rest)} more modules", "", *cells[:3], "", *cells[3:])
    t = report.totals
    table.add_section()
    table.add_row(
        "total",
        f"{t.ops} ops",
        *_cells(t.flops, t.min_bytes, t.roofline_time_s, total_s)[:3],
        "",
        f"{t.roofline_time_s * 1e3:,.3f}",
        "100.0%",
        style="bold",
    )
    console.print(table)
    console.print(
        f"FLOPs count a multiply-add as 2 (FLOPs = 2 x MACs): {t.gemm_flops / 2e9:,.3f} GMACs "
        f"in matmuls, convolutions and attention of {t.flops / 1e9:,.3f} GFLOP in all.\n"
        f"Predicted time per op = max(FLOPs / attainable FLOP/s x GEMM efficiency + a GEMM "
        f"kernel's latency, min bytes / attainable bandwidth or the kernel floor) (+ cuDNN's "
        f"layout conversions for an NCHW convolution) + launch overhead x kernels: "
        f"{t.kernel_time_s * 1e3:,.3f} ms on "
        f"the GPU + {t.launch_s * 1e3:,.3f} ms launching {t.kernels} kernels (eager, not "
        f"overlapped).",
        highlight=False,
    )
