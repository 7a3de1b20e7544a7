"""Render Markdown tables from benchmark result files (the README's tables come from here).

    python benchmarks/summarize.py benchmarks/results/kernels-h200-*/bench_*.json

Each result file is what `gpushape.bench.write_results` wrote: an "environment" (GPU, versions,
date, command), the "criteria" the issue sets with measured values and verdicts, and "results".
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def environment_line(env: dict) -> str:
    return (
        f"{env.get('gpu')} ({env.get('sm_count')} SMs), torch {env.get('torch')}, "
        f"triton {env.get('triton')}, CUDA {env.get('cuda')}, {env.get('date_utc')}, "
        f"`{env.get('command')}`"
    )


def criteria_table(criteria: list[dict]) -> list[str]:
    """The issue's targets, one row each; the many per-shape "not slower than eager" checks are
    folded into one line under the table (with the ones that fail named)."""
    lines = ["| criterion | measured | target | verdict |", "| --- | ---: | ---: | --- |"]
    floor = [c for c in criteria if "not slower than eager" in c["criterion"]]
    for c in criteria:
        if c in floor:
            continue
        value = "n/a" if c.get("value") is None else f"{c['value']:.3g}"
        lines.append(f"| {c['criterion']} | {value} | {c['target']:g} | {c['verdict']} |")
    if floor:
        failed = [
            f"{c['criterion'].replace(' not slower than eager', '')} ({c['value']:.2f}x)"
            for c in floor
            if c["verdict"] != "PASS"
        ]
        lines += [
            "",
            f"Not slower than eager: {len(floor) - len(failed)} of {len(floor)} "
            "(op, shape, pass) checks pass"
            + (f"; below 1x: {', '.join(failed)}." if failed else "."),
        ]
    return lines


def timing_table(rows: list[dict], op: str = "") -> list[str]:
    """Median ms per (op, shape, direction) and variant, from the flat row lists (`op` for
    rows that do not name one)."""
    table: dict[tuple, dict[str, float]] = defaultdict(dict)
    variants: list[str] = []
    for r in rows:
        key = (r.get("op", op), "x".join(map(str, r["shape"])), r["direction"])
        table[key][r["variant"]] = r["median_ms"]
        if r["variant"] not in variants:
            variants.append(r["variant"])
    head = "| op | shape | pass | " + " | ".join(f"{v} ms" for v in variants) + " |"
    lines = [head, "| --- | --- | --- |" + " ---: |" * len(variants)]
    for (op, shape, direction), times in table.items():
        cells = " | ".join(f"{times[v]:.3f}" if v in times else "-" for v in variants)
        lines.append(f"| {op} | {shape} | {direction} | {cells} |")
    return lines


def summarize(path: Path) -> str:
    data = json.loads(path.read_text())
    out = [f"### {path.stem}", "", environment_line(data["environment"]), ""]
    rows = data.get("results")
    if isinstance(rows, list) and rows and "variant" in rows[0]:
        out += [*timing_table(rows, path.stem.removeprefix("bench_")), ""]
    if data.get("criteria"):
        out += [*criteria_table(data["criteria"]), ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    for name in argv:
        print(summarize(Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
