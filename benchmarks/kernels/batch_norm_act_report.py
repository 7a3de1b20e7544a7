"""Reporting for bench_batch_norm_act.py: speed-ups, the issue's done-when verdicts, the plot and
the table (kept apart so the measuring script stays short)."""

from __future__ import annotations

from pathlib import Path

VARIANTS = ("eager", "compile", "gpushape")
# Passes over one (N, C, H, W) tensor: the anchors' minimum bytes, behind every GB/s column.
PASSES = {"fwd": 4.0, "fwd+bwd": 9.0, "fwd+bwd accum": 9.0, "fwd+bwd graph": 9.0}
TARGETS = {"eager": 2.5, "compile": 1.5}  # the fwd+bwd speedups, every stage shape


def shape_name(shape) -> str:
    return "x".join(map(str, shape))


def add_speedups(rows: list[dict]) -> None:
    """Each row gets `speedup_vs_<variant>` = that variant's median / this row's median."""
    by_key = {(tuple(r["shape"]), r["direction"], r["variant"]): r for r in rows}
    for r in rows:
        for other in VARIANTS:
            base = by_key.get((tuple(r["shape"]), r["direction"], other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def criteria(rows: list[dict]) -> list[dict]:
    """The issue's done-when: fwd+bwd >= 2.5x eager and >= 1.5x compile at every stage shape."""
    out = []
    for r in rows:
        if r["variant"] != "gpushape" or r["direction"] not in ("fwd+bwd", "fwd+bwd graph"):
            continue
        for other, target in TARGETS.items():
            value = r.get(f"speedup_vs_{other}")
            out.append(
                dict(
                    criterion=f"{r['direction']} vs {other} @{shape_name(r['shape'])}",
                    value=value,
                    target=target,
                    verdict="PASS" if value and value >= target else "FAIL",
                )
            )
    return out


def plot(
    rows: list[dict], copy_gbps: float, path: Path, shapes: list[tuple], activation: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directions = ("fwd", "fwd+bwd", "fwd+bwd graph")
    fig, axes = plt.subplots(1, len(directions), figsize=(6 * len(directions), 4))
    shapes = [s for s in shapes if any(tuple(r["shape"]) == s for r in rows)]
    width = 0.8 / len(VARIANTS)
    for ax, direction in zip(axes, directions):
        for k, name in enumerate(VARIANTS):
            vals = [
                next(
                    (
                        r["gbps"]
                        for r in rows
                        if r["variant"] == name
                        and r["direction"] == direction
                        and tuple(r["shape"]) == s
                    ),
                    0.0,
                )
                for s in shapes
            ]
            ax.bar([i + k * width for i in range(len(shapes))], vals, width, label=name)
        ax.axhline(copy_gbps, color="k", ls="--", lw=1, label="copy (same run)")
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(shapes))],
            [shape_name(s) for s in shapes],
            fontsize=7,
        )
        ax.set_title(f"BN(train)+add+{activation} {direction}, bf16 channels_last")
        ax.set_ylabel(f"GB/s ({PASSES[direction]:g} passes / median time)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(
    rows: list[dict], copy_gbps: float, verdicts: list[dict], shapes: list[tuple]
) -> None:
    print(
        f"\ncopy bandwidth (same run): {copy_gbps:.0f} GB/s. Median ms by CUDA events. GB/s "
        f"from the anchors' minimum bytes (fwd 4, fwd+bwd 9 passes), %copy of the same run; "
        f"own GB/s: gpushape's actual traffic (fwd 4.06, fwd+bwd 10.19 passes)"
    )
    head = (
        f"{'shape':>17s} {'dir':13s}"
        + "".join(f"{v:>9s}" for v in VARIANTS)
        + "".join(f"{v[:7] + ' GB/s':>13s}" for v in VARIANTS)
        + f"{'%copy':>7s}{'own GB/s':>9s}{'x eager':>8s}{'x comp':>7s}"
    )
    print(head)
    for shape in shapes:
        for direction in PASSES:
            sel = {
                r["variant"]: r
                for r in rows
                if tuple(r["shape"]) == shape and r["direction"] == direction
            }
            if "gpushape" not in sel:
                continue
            ours = sel["gpushape"]
            ms = "".join(
                f"{sel[v]['median_ms']:9.3f}" if v in sel else f"{'n/a':>9s}" for v in VARIANTS
            )
            gbps = "".join(
                f"{sel[v]['gbps']:13.0f}" if v in sel else f"{'n/a':>13s}" for v in VARIANTS
            )
            own = f"{ours['own_gbps']:9.0f}" if "own_gbps" in ours else f"{'':9s}"
            print(
                f"{shape_name(shape):>17s} {direction:13s}{ms}{gbps}"
                f"{100 * ours['gbps'] / copy_gbps:6.0f}%{own}"
                f"{ours.get('speedup_vs_eager', float('nan')):8.2f}"
                f"{ours.get('speedup_vs_compile', float('nan')):7.2f}"
            )
    print()
    for v in verdicts:
        value = "n/a" if v["value"] is None else f"{v['value']:.2f}"
        print(f"{v['verdict']:5s} {v['criterion']}: {value}x (target >= {v['target']:g}x)")
