"""Reporting for bench_norms.py: speed-ups, the issue's done-when verdicts, the table, the plot."""

from __future__ import annotations

from pathlib import Path

VARIANTS = ("eager", "compile", "liger", "gpushape")
MAIN_SHAPE = (32768, 4096)  # where the targets are judged


def add_speedups(rows: list[dict]) -> None:
    """Each row gets `speedup_vs_<variant>` = that variant's median / this row's median."""
    by_key = {(r["op"], tuple(r["shape"]), r["direction"], r["variant"]): r for r in rows}
    for r in rows:
        for other in VARIANTS:
            base = by_key.get((r["op"], tuple(r["shape"]), r["direction"], other))
            if base is not None and base is not r:
                r[f"speedup_vs_{other}"] = base["median_ms"] / r["median_ms"]


def criteria(rows: list[dict], copy_gbps: float) -> list[dict]:
    """The issue's done-when targets, judged on this run's numbers."""
    ours = {
        (r["op"], tuple(r["shape"]), r["direction"]): r for r in rows if r["variant"] == "gpushape"
    }
    out = []

    def judge(name, key, value_fn, target, unit):
        row = ours.get(key)
        if row is None:
            return
        value = value_fn(row)
        if value is None:
            out.append(dict(criterion=name, value=None, target=target, verdict="not run"))
            return
        out.append(
            dict(
                criterion=name,
                value=value,
                target=target,
                unit=unit,
                verdict="PASS" if value >= target else "FAIL",
            )
        )

    pct = lambda r: r["gbps"] / copy_gbps
    vs = lambda other: lambda r: r.get(f"speedup_vs_{other}")
    m = MAIN_SHAPE
    judge(
        "layer_norm_gelu fwd % of copy @32768x4096",
        ("layer_norm_gelu", m, "fwd"),
        pct,
        0.85,
        "fraction",
    )
    for direction in ("fwd+bwd", "fwd+bwd graph"):
        for other, target in (("eager", 2.5), ("compile", 1.3), ("liger", 1.3)):
            judge(
                f"layer_norm_gelu {direction} vs {other} @32768x4096",
                ("layer_norm_gelu", m, direction),
                vs(other),
                target,
                "x",
            )
    for op in ("add_layer_norm", "rms_norm"):
        judge(f"{op} fwd % of copy @32768x4096", (op, m, "fwd"), pct, 0.80, "fraction")
        for direction in ("fwd+bwd", "fwd+bwd graph"):
            judge(
                f"{op} {direction} vs eager @32768x4096", (op, m, direction), vs("eager"), 2.0, "x"
            )
    for (op, shape, direction), _row in sorted(ours.items()):
        judge(
            f"{op} {direction} not slower than eager @{shape[0]}x{shape[1]}",
            (op, shape, direction),
            vs("eager"),
            1.0,
            "x",
        )
    return out


def plot(rows: list[dict], copy_gbps: float, shapes_order: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(len(ops), 2, figsize=(13, 3.6 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, direction in enumerate(("fwd", "fwd+bwd")):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and r["direction"] == direction]
            shapes = sorted({tuple(r["shape"]) for r in sel}, key=shapes_order.index)
            names = [v for v in VARIANTS if any(r["variant"] == v for r in sel)]
            width = 0.8 / max(1, len(names))
            for k, name in enumerate(names):
                vals = [
                    next(
                        (r["gbps"] for r in sel if r["variant"] == name and tuple(r["shape"]) == s),
                        0.0,
                    )
                    for s in shapes
                ]
                ax.bar([x + k * width for x in range(len(shapes))], vals, width, label=name)
            ax.axhline(copy_gbps, color="k", ls="--", lw=1, label="copy (same run)")
            ax.set_xticks(
                [x + 0.4 - width / 2 for x in range(len(shapes))],
                [f"{s[0]}x{s[1]}" for s in shapes],
            )
            ax.set_title(f"{op} {direction}, bf16")
            ax.set_ylabel("GB/s (minimum bytes / median time)")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(
    rows: list[dict], copy_gbps: float, shapes_order: list, verdicts: list[dict]
) -> None:
    print(
        f"\ncopy bandwidth (same run): {copy_gbps:.0f} GB/s; median ms by CUDA events; "
        f"GB/s and % copy are gpushape's, from minimum bytes (see --help); 'graph': "
        f"replayed from a CUDA graph (GPU time, no host cost)"
    )
    head = (
        f"{'op':16s} {'shape':>11s} {'dir':13s}"
        + "".join(f"{v:>10s}" for v in VARIANTS)
        + f"{'GB/s':>7s}{'%copy':>7s}{'x eager':>9s}{'x comp':>8s}{'x liger':>9s}"
    )
    print(head)
    keys = sorted(
        {(r["op"], tuple(r["shape"]), r["direction"]) for r in rows},
        key=lambda k: (k[0], shapes_order.index(k[1]), k[2]),
    )
    for op, shape, direction in keys:
        sel = {
            r["variant"]: r
            for r in rows
            if (r["op"], tuple(r["shape"]), r["direction"]) == (op, shape, direction)
        }
        ours = sel["gpushape"]
        ms = "".join(
            f"{sel[v]['median_ms']:10.3f}" if v in sel else f"{'n/a':>10s}" for v in VARIANTS
        )
        ups = "".join(
            f"{ours.get(f'speedup_vs_{v}', float('nan')):{w}.2f}"
            for v, w in (("eager", 9), ("compile", 8), ("liger", 9))
        )
        print(
            f"{op:16s} {shape[0]:>5d}x{shape[1]:<5d} {direction:13s}{ms}"
            f"{ours['gbps']:7.0f}{100 * ours['gbps'] / copy_gbps:6.0f}%{ups}"
        )
    print()
    for v in verdicts:
        value = "n/a" if v["value"] is None else f"{v['value']:.3g}"
        print(f"{v['verdict']:8s} {v['criterion']}: {value} (target >= {v['target']:g})")
