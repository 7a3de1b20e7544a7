"""What `gpushape bench` prints and keeps: tables, CSV rows (appended, one per variant or
fix, each with GPU, versions, date and command), and a plot per case."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .fix_by_fix import LoopResult
from .run import BenchResult

BENCH_COLUMNS = (
    "date_utc", "gpu", "torch", "triton", "cuda", "model", "batch", "task", "baseline",
    "variant", "median_ms", "p10_ms", "p90_ms", "samples_per_s", "tokens_per_s",
    "speedup_vs_baseline", "warmup_s", "peak_memory_gb", "kernels_per_step", "gpu_busy_pct",
    "mfu_pct", "bound", "notes", "command", "mfu_measured_pct", "gflop_per_sample",
)  # fmt: skip
LOOP_COLUMNS = (
    "date_utc", "gpu", "torch", "triton", "model", "mode", "fix", "places",
    "predicted_gpu_ms", "predicted_wall_ms", "measured_wall_ms", "measured_gpu_ms",
    "predicted_over_measured", "step_ms_after", "command", "predicted_here_wall_ms", "host_scale",
)  # fmt: skip


def _num(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "" if value is None else f"{value * scale:.{digits}f}"


def _env(env: dict[str, Any]) -> dict[str, Any]:
    keys = ("date_utc", "gpu", "torch", "triton", "cuda", "command")
    return {k: env.get(k) or "" for k in keys}


def bench_rows(result: BenchResult) -> list[dict[str, Any]]:
    rows = []
    for name, s in result.stats.items():
        rows.append(
            {
                **_env(result.env),
                "model": result.model,
                "batch": " ".join(result.batch_shapes),
                "task": result.task,
                "baseline": result.baseline,
                "variant": name,
                "median_ms": _num(s.median_s, 1e3),
                "p10_ms": _num(s.quantile(0.1), 1e3),
                "p90_ms": _num(s.quantile(0.9), 1e3),
                "samples_per_s": _num(s.samples_per_s, 1, 1),
                "tokens_per_s": _num(s.tokens_per_s, 1, 0),
                "speedup_vs_baseline": _num(result.ratio(name)),
                "warmup_s": _num(s.warmup_s, 1, 2),
                "peak_memory_gb": _num(s.peak_memory_bytes, 1e-9, 2),
                "kernels_per_step": "" if s.kernels is None else s.kernels,
                "gpu_busy_pct": _num(s.busy_fraction, 100, 1),
                "mfu_pct": _num(s.mfu, 100, 1),
                "mfu_measured_pct": _num(s.mfu_measured, 100, 1),
                "gflop_per_sample": _num(
                    s.variant_flops / s.samples if s.variant_flops else None, 1e-9, 2
                ),
                "bound": s.bound,
                "notes": "; ".join(result.notes.get(name, [])),
            }
        )
    return rows


def loop_rows(result: LoopResult, env: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            **_env(env),
            "model": result.model,
            "mode": result.mode,
            "fix": r.fix,
            "places": r.places,
            "predicted_gpu_ms": _num(r.predicted_gpu_s, 1e3),
            "predicted_wall_ms": _num(r.predicted_wall_s, 1e3),
            "measured_wall_ms": _num(r.measured_wall_s, 1e3),
            "measured_gpu_ms": _num(r.measured_gpu_s, 1e3),
            "predicted_over_measured": _num(r.ratio, 1, 2),
            "step_ms_after": _num(result.stages[r.stage].median_s, 1e3),
            "predicted_here_wall_ms": _num(r.predicted_here_wall_s, 1e3),
            "host_scale": _num(result.host_scale, 1, 2),
        }
        for r in result.rows
    ]


def append_csv(path: str | Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Path:
    """Append rows (a header first when the file is new). A file written before a column was
    added is rewritten once with the longer header, its old rows blank in the new columns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = tuple(reader.fieldnames or ())
            old = list(reader) if header != columns else []
        if header != columns:
            extra = tuple(c for c in header if c not in columns)  # kept, after ours
            columns = columns + extra
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(old)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return path


def bench_table(result: BenchResult, console: Console) -> None:
    title = f"{result.model}: training step, {' '.join(result.batch_shapes)} ({result.task})"
    table = Table(title=escape(title), title_justify="left")
    for col in ("variant", "step ms", "p10-p90", "samples/s", "tokens/s", "x base", "warm-up s",
                "peak GB", "kernels", "GPU busy", "host ms", "MFU (meas.)", "bound"):  # fmt: skip
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name, s in result.stats.items():
        table.add_row(
            escape(name),
            f"{s.median_s * 1e3:,.2f}",
            f"{s.quantile(0.1) * 1e3:,.2f}-{s.quantile(0.9) * 1e3:,.2f}",
            f"{s.samples_per_s:,.1f}",
            f"{s.tokens_per_s:,.0f}" if s.tokens_per_s else "-",
            f"{result.ratio(name):.2f}",
            f"{s.warmup_s:,.1f}",
            _num(s.peak_memory_bytes, 1e-9, 2) or "-",
            "-" if s.kernels is None else str(s.kernels),
            _num(s.busy_fraction, 100, 0) + "%" if s.busy_fraction is not None else "-",
            f"{s.issue_s * 1e3:,.2f}" if s.issue_s is not None else "-",
            _mfu(s),
            s.bound,
        )
    console.print(table)
    console.print(
        "MFU: model FLOPs a second over the chip's datasheet dense peak, and in brackets over "
        "its measured GEMM peak (gpushape probe's)"
        if any(s.mfu_measured for s in result.stats.values())
        else "MFU: model FLOPs a second over the chip's datasheet dense peak"
    )
    work = _flops_line(result)
    if work:
        console.print(work)
    if any(s.issue_s is not None for s in result.stats.values()):
        console.print(
            "host ms: the time for the step's Python to return when started on an idle GPU "
            "(dispatch and launches, and any wait for the GPU the step makes); near the step "
            "time, the host sets the pace"
        )
    for name, notes in result.notes.items():
        console.print(escape(f"{name}: {'; '.join(notes)}"))
    for name, why in result.failed.items():
        console.print(escape(f"{name}: failed: {why}"))
    verdicts = result.loss_verdicts()
    if verdicts:
        console.print(
            f"loss over {result.loss_steps} steps from the same weights on the fixed batch "
            "(mean of the last 3):"
        )
        for v in verdicts.values():
            console.print(escape(f"  {v.text()}"))
        for name, why in result.loss_failed.items():
            console.print(escape(f"  {name}: failed to train: {why}"))


def _mfu(s) -> str:
    if s.mfu is None:
        return "-"
    text = f"{s.mfu * 100:.1f}%"
    return text + (f" ({s.mfu_measured * 100:.1f}%)" if s.mfu_measured is not None else "")


def _flops_line(result: BenchResult) -> str:
    """Each variant's forward and backward FLOPs per sample, from its own trace, against the
    baseline's: a rewrite that does less (or more) work than the model shows here."""
    base = result.stats[result.baseline]
    if not base.variant_flops:
        return ""
    per = base.variant_flops / base.samples / 1e9
    cells = [f"{escape(result.baseline)} {per:,.2f} GFLOP"]
    for name, s in result.stats.items():
        if name == result.baseline:
            continue
        own = f"{s.variant_flops / base.variant_flops:.3f}x" if s.variant_flops else "not traced"
        cells.append(f"{escape(name)} {own}")
    return "forward+backward FLOPs a sample, each variant's own trace: " + "; ".join(cells)


def kernels_table(result: BenchResult, console: Console, top: int) -> None:
    """Each variant's `top` kernels by GPU time per step: where the time goes."""
    for name, s in result.stats.items():
        if not s.top_kernels:
            continue
        table = Table(title=escape(f"{name}: top kernels per step"), title_justify="left")
        table.add_column("ms", justify="right")
        table.add_column("share", justify="right")
        table.add_column("kernel")
        for kernel, secs in s.top_kernels[:top]:
            share = f"{secs / s.gpu_busy_s:.0%}" if s.gpu_busy_s else "-"
            table.add_row(f"{secs * 1e3:,.3f}", share, escape(kernel))
        console.print(table)


def loop_table(result: LoopResult, console: Console) -> None:
    title = f"{result.model}, {result.mode} mode: each fix, predicted beside measured"
    table = Table(title=escape(title), title_justify="left")
    here = result.host_scale is not None
    columns = ["stage", "places", "step ms", "predicted ms", "measured ms", "rounds",
               "GPU: predicted", "GPU: measured", "pred/meas"]  # fmt: skip
    if here:
        columns += ["this host: predicted ms", "pred/meas"]
    for col in columns:
        table.add_column(col, justify="left" if col == "stage" else "right")
    given = result.stages["as given"]
    table.add_row("as given", "", f"{given.median_s * 1e3:,.2f}", *[""] * (len(columns) - 3))
    for r in result.rows:
        cells = [
            escape(r.stage),
            str(r.places),
            f"{result.stages[r.stage].median_s * 1e3:,.2f}",
            _num(r.predicted_wall_s, 1e3),
            _num(r.measured_wall_s, 1e3),
            _rounds(r),
            _num(r.predicted_gpu_s, 1e3),
            _num(r.measured_gpu_s, 1e3) or "-",
            _verdict(r),
        ]
        if here:
            cells += [_num(r.predicted_here_wall_s, 1e3) or "-", _verdict(r, here=True)]
        table.add_row(*cells)
    console.print(table)
    if here:
        console.print(
            f"this host: each stage predicted again with the profile's host rates x "
            f"{result.host_scale:.2f}, this host's issue time of the step as given over the "
            "audit's (steps/host_here.py)"
        )
    console.print(
        f"all fixes: {result.speedup:.2f}x the step as given (measured; ms are per step, "
        "savings of each fix on top of the ones above it; rounds: the lowest and highest "
        "saving of a single round; within noise where too few rounds agree on its sign, a "
        "sign test at 5%)"
    )
    for stage, why in result.failed.items():
        console.print(escape(f"{stage}: failed: {why}"))
    for fix, why in getattr(result, "left_out", {}).items():
        console.print(escape(f"not in the loop: {fix} ({why})"))


def plot_bench(result: BenchResult, path: str | Path) -> Path:
    """Samples/s per variant as bars with their ratio to the baseline; with a loss check, the
    loss curves beside them."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    names = list(result.stats)
    rates = [result.stats[n].samples_per_s for n in names]
    curves = result.loss_curves
    height = 0.5 * len(names) + 1.5
    if curves:
        fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(12, max(height, 3.5)))
    else:
        fig, ax = plt.subplots(figsize=(7, height))
    bars = ax.barh(names, rates, color="#4c72b0")
    for bar, name in zip(bars, names, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {result.ratio(name):.2f}x", va="center")  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("samples / s (median)")
    ax.set_title(f"{result.model}: {result.env.get('gpu') or 'CPU'}", fontsize=10)
    if curves:
        verdicts = result.loss_verdicts()
        for name, c in curves.items():
            v = verdicts.get(name)
            label = name if v is None or v.verdict == "baseline" else f"{name} ({v.verdict})"
            loss_ax.plot(range(c.start, c.start + len(c.losses)), c.losses, label=label)
        loss_ax.set_xlabel("training step (same weights, fixed batch)")
        loss_ax.set_ylabel("loss")
        loss_ax.set_title("does each variant still train?", fontsize=10)
        loss_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_loop(result: LoopResult, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fixes = [r.fix for r in result.rows]
    y = range(len(fixes))
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(fixes) + 1.5))
    ax.barh([i - 0.2 for i in y], [r.predicted_wall_s * 1e3 for r in result.rows], 0.4,
            label="predicted", color="#dd8452")  # fmt: skip
    ax.barh([i + 0.2 for i in y], [(r.measured_wall_s or 0) * 1e3 for r in result.rows], 0.4,
            label="measured", color="#4c72b0")  # fmt: skip
    ax.set_yticks(list(y), fixes)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("wall-clock saving per step (ms)")
    ax.set_title(f"{result.model}, {result.mode}: {result.speedup:.2f}x measured", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _rounds(r) -> str:
    if r.measured_spread_s is None:
        return "-"
    lo, hi = r.measured_spread_s
    return f"{lo * 1e3:,.2f}..{hi * 1e3:,.2f}"


def _verdict(r, here: bool = False) -> str:
    ratio = r.ratio_here if here else r.ratio
    if r.within_noise:
        return "within noise"
    if ratio is not None:
        return f"{ratio:.2f}"
    return "slower" if (r.measured_wall_s or 0.0) < 0 else "-"
