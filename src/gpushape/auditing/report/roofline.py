"""The roofline plot: every layer a point (arithmetic intensity, predicted FLOP/s) under the
chip's roofs, coloured by the finding that names its module. Drawn with matplotlib's Agg
backend (no display needed) and returned as PNG bytes for embedding."""

from __future__ import annotations

import io
from fnmatch import fnmatchcase
from typing import Any

from ..finding import Severity

ROOF_COLOR = "#d62728"  # the roofs; tests look for this colour in the rendered page
PLAIN_COLOR = "#9a9a9a"  # layers no finding names
RULE_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)


def finding_for(module: str, findings: list[Any]) -> Any:
    """The most severe finding (above info) whose module path or pattern names `module`."""
    best = None
    for f in findings:
        if f.severity == Severity.INFO or not f.module:
            continue
        named = fnmatchcase(module, f.module) or module.startswith(f.module + ".")
        if named and (best is None or f.severity > best.severity):
            best = f
    return best


def _roofs(ax: Any, spec: Any, dtype: str, x_lo: float, x_hi: float) -> None:
    import numpy as np

    bandwidth = spec.attainable_bandwidth_bytes_per_s()
    xs = np.logspace(np.log10(x_lo), np.log10(x_hi), 200)
    roofs = (
        [(spec.attainable_flops(dtype if dtype != "tf32" else "fp32"), f"{dtype} tensor cores")]
        if spec.has_tensor_cores(dtype)
        else []
    )
    roofs.append((spec.attainable_flops("fp32", tensor_cores=False), "fp32 CUDA cores"))
    for i, (peak, label) in enumerate(roofs):
        ax.plot(
            xs,
            np.minimum(peak, xs * bandwidth),
            color=ROOF_COLOR,
            lw=2.2 - i,
            ls="-" if i == 0 else "--",
            label=f"roof: {label}, {bandwidth / 1e12:.2f} TB/s",
        )


def roofline_png(report: Any, *, dpi: int = 110) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [x for x in report.layers if x.flops > 0 and x.min_bytes > 0 and x.roofline_time_s > 0]
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=dpi)
    colors: dict[str, str] = {}
    groups: dict[str, list[tuple[float, float, float]]] = {}
    total = report.totals.roofline_time_s or 1.0
    for layer in layers:
        f = finding_for(layer.module, report.findings)
        key = f.rule if f else "no finding"
        if f and key not in colors:
            colors[key] = RULE_COLORS[len(colors) % len(RULE_COLORS)]
        size = 12 + 400 * layer.roofline_time_s / total
        groups.setdefault(key, []).append(
            (layer.intensity, layer.flops / layer.roofline_time_s, size)
        )
    for key, points in sorted(groups.items(), key=lambda kv: kv[0] == "no finding", reverse=True):
        xs, ys, sizes = zip(*points)
        ax.scatter(
            xs,
            ys,
            s=sizes,
            alpha=0.75,
            color=colors.get(key, PLAIN_COLOR),
            edgecolors="white",
            linewidths=0.4,
            label=key,
            zorder=3,
        )
    lo = min((x.intensity for x in layers), default=0.1)
    hi = max((x.intensity for x in layers), default=1e3)
    if report.gpu_spec is not None:
        _roofs(ax, report.gpu_spec, report.dtype, max(lo / 2, 1e-3), max(hi * 2, 10.0))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per minimum byte)")
    ax.set_ylabel("predicted FLOP/s (FLOPs / predicted time)")
    ax.set_title(
        f"{report.model} on {report.gpu}: each layer (module, op, phase) a point, "
        f"size = share of time",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()
