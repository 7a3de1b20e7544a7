"""correlate.py's outputs: the predicted-against-measured plot and the console table."""

from __future__ import annotations

import math
from pathlib import Path


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 5), squeeze=False)
    for ax, res in zip(axes[0], results):
        types = sorted({r["type"] for r in res["rows"]})
        for t in types:
            rows = [r for r in res["rows"] if r["type"] == t]
            ax.scatter(
                [r["measured_s"] * 1e3 for r in rows],
                [r["predicted_kernel_s"] * 1e3 for r in rows],
                s=12,
                label=t,
            )
        lo = min(min(r["measured_s"], r["predicted_kernel_s"]) for r in res["rows"]) * 1e3
        hi = max(max(r["measured_s"], r["predicted_kernel_s"]) for r in res["rows"]) * 1e3
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=f"measured ms/step ({res['measured_what']})",
            ylabel="predicted kernel ms/step (roofline)",
            title=f"{res['model']} b{res['batch']}: Spearman "
            f"{res['spearman_kernel_time']:.2f}, pred/meas {res['ratio_kernel']:.2f}",
        )
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def print_table(results: list[dict]) -> bool:
    """Each model's line, its top modules, and predicted / measured by module type; whether
    every Spearman is a number."""
    print(
        f"{'model':<10}{'modules':>8}{'Spearman':>10}{'(roofline)':>11}{'pred ms':>9}"
        f"{'meas ms':>9}{'pred/meas':>10}{'step ms':>9}"
    )
    for r in results:
        print(
            f"{r['model']:<10}{r['modules']:>8}{r['spearman_kernel_time']:>10.3f}"
            f"{r['spearman_roofline_time']:>11.3f}{r['predicted_total_kernel_s'] * 1e3:>9.2f}"
            f"{r['measured_total_s'] * 1e3:>9.2f}{r['ratio_kernel']:>10.2f}"
            f"{r['measured_step_median_s'] * 1e3:>9.2f}"
        )
        top = sorted(r["rows"], key=lambda row: row["measured_s"], reverse=True)[:5]
        for row in top:
            print(
                f"  {row['module'][:34]:<34} measured {row['measured_s'] * 1e3:7.3f} ms  "
                f"predicted {row['predicted_kernel_s'] * 1e3:7.3f} ms"
            )
    ok = all(not math.isnan(r["spearman_kernel_time"]) for r in results)
    print("predicted / measured by module type (sums over a model's modules of that type):")
    for r in results:
        by_type = ", ".join(
            f"{t} {p / m:.2f}" for t, (p, m) in sorted(_by_type(r).items()) if m > 0
        )
        print(f"  {r['model']}: {by_type}")
    return ok


def _by_type(result: dict) -> dict[str, tuple[float, float]]:
    """module type -> (predicted kernel time, measured time), summed over its modules."""
    sums: dict[str, tuple[float, float]] = {}
    for row in result["rows"]:
        p, m = sums.get(row["type"], (0.0, 0.0))
        sums[row["type"]] = (p + row["predicted_kernel_s"], m + row["measured_s"])
    return sums
