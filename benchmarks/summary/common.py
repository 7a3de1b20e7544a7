"""What every section uses: where the result files are, reading them, Markdown table helpers.

`summarize(path)` renders the tables of one result file (the script's default mode); the rest
are the results page's helpers: `load` reads a result file, `link` links it from docs/, and
`md_table`, `ms`, `ratio` format what the sections print.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PROFILE = ROOT / "src" / "gpushape" / "hardware" / "profiles" / "h200-sxm.json"
DOCS_COMMAND = "python benchmarks/summarize.py docs > docs/results-h200.md"


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
    rows that do not name one; rows without a median, such as memory rows, are left out)."""
    table: dict[tuple, dict[str, float]] = defaultdict(dict)
    variants: list[str] = []
    for r in rows:
        if "median_ms" not in r:
            continue
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


def result_files() -> list[Path]:
    """The files under benchmarks/results/ that git tracks (staged ones too), sorted: a file
    written there but not added yet changes nothing, so the page renders the same in every
    checkout of a commit. Every file there when git cannot say (no checkout, no git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", RESULTS.relative_to(ROOT).as_posix()],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        listed = ""
    files = [ROOT / rel for rel in listed.split("\0") if rel]
    if not files:
        files = list(RESULTS.rglob("*"))
    return sorted(path for path in files if path.is_file())


def load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def link(rel: str, text: str | None = None) -> str:
    """A link from docs/ to a result file (`rel` under benchmarks/results/)."""
    return f"[{text or rel}](../benchmarks/results/{rel})"


def src_link(rel: str) -> str:
    return f"[`{rel}`](../{rel})"


def md_table(head: Iterable[str], rows: Iterable[Iterable[object]], right: int = 0) -> list[str]:
    """A Markdown table; the last `right` columns are right-aligned."""
    head = list(head)
    align = ["---"] * (len(head) - right) + ["---:"] * right
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def ms(seconds: float | None, digits: int = 3) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    return "-" if a is None or not b else f"{a / b:.{digits}f}"


def shape_str(shape: Iterable[int]) -> str:
    return "x".join(map(str, shape))


def log_summary(rel: str) -> str:
    """The last line of a pytest log: 'N passed, ... in Ts'."""
    lines = [ln.strip() for ln in (RESULTS / rel).read_text().splitlines() if ln.strip()]
    return lines[-1].strip("= ")


def log_lines(rel: str) -> list[str]:
    """A log's own lines, without Python warnings and the source lines they quote."""
    keep = []
    for line in (RESULTS / rel).read_text().splitlines():
        if "Warning" in line or line.startswith("  return ") or line.startswith("  _warn"):
            continue
        keep.append(line.rstrip())
    return keep


def kernel_name(name: str) -> str:
    """A CUDA kernel's name without template arguments and parameters."""
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return re.sub(r"::+", "::", "".join(out)).strip()
