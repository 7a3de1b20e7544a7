"""Every timed loop re-predicted with the cost model as it is now (audit-cpu/loop-scoreboard-
<gpu>.json, `benchmarks/steps/loop_scoreboard.py`): how many fixes of high and medium findings
meet the advice's target, by GPU kind and by fix, and which miss it."""

from __future__ import annotations

import json
import statistics
from collections import Counter

from .common import RESULTS, link, md_table

FOLDER = "audit-cpu"
KINDS = (("h200", "H200", "the shipped profile"), ("h100", "H100", "the H100 probe's profile"))
JUDGED = ("meets", "misses", "within noise")


def _load(gpu: str) -> dict | None:
    path = RESULTS / FOLDER / f"loop-scoreboard-{gpu}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _rows(data: dict) -> list[dict]:
    return [dict(r, file=c["file"]) for c in data["results"]["loops"] for r in c.get("rows", [])]


def _counts(rows: list[dict], key: str) -> str:
    c = Counter(r[key] for r in rows)
    return " / ".join(str(c[v]) for v in JUDGED)


def _scales(loops: list[dict]) -> str:
    """The runs' hosts against the profile's: each loop's host scale, median (range) by mode."""
    out = []
    for mode in ("eager", "compile"):
        xs = sorted(
            c["rows"][0]["host_scale"]
            for c in loops
            if c.get("rows") and c["rows"][0]["mode"] == mode and c["rows"][0]["host_scale"]
        )
        if xs:
            mid = statistics.median(xs)
            out.append(f"{mode} {mid:.2f} ({xs[0]:.2f}-{xs[-1]:.2f}, {len(xs)})")
    return "; ".join(out) or "-"


def scoreboard_section() -> list[str]:
    boards = [(kind, name, where, _load(kind)) for kind, name, where in KINDS]
    boards = [b for b in boards if b[3] is not None]
    if not boards:
        return []
    head = ("GPU", "loops", "fixes timed", "judged: meet / miss / within noise",
            "on the run's host", "median abs log2(pred/meas)",
            "run's host / profile's: median (range, loops)", "file")  # fmt: skip
    rows, by_fix, misses = [], {}, []
    for kind, name, where, data in boards:
        loops = data["results"]["loops"]
        fixes = _rows(data)
        summ = data["results"]["summary"]
        rel = f"{FOLDER}/loop-scoreboard-{kind}.json"
        rows.append((
            f"{name} ({where})", len(loops), len(fixes), _counts(fixes, "verdict"),
            _counts(fixes, "verdict_here"), f"{summ.get('median_abs_log2_ratio', 0):.2f}",
            _scales(loops), link(rel, f"loop-scoreboard-{kind}.json"),
        ))  # fmt: skip
        for r in fixes:
            by_fix.setdefault((name, r["fix"]), []).append(r)
            if r["verdict_here"] == "misses":
                misses.append((name, r))
    fix_rows = [
        (name, f"`{fix}`", len(rs), _counts(rs, "verdict"), _counts(rs, "verdict_here"))
        for (name, fix), rs in sorted(by_fix.items())
        if any(r["verdict"] in JUDGED or r["verdict_here"] in JUDGED for r in rs)
    ]
    miss_rows = [
        (name, r["file"].split("/")[0], f"`{r['model'].split('?')[0]}`", r["mode"],
         f"`{r['fix']}`", f"{r['predicted_here_wall_s'] * 1e3:.3f}",
         f"{r['measured_wall_s'] * 1e3:.3f}")
        for name, r in misses
    ]  # fmt: skip
    return [
        "### Every loop, re-predicted by the cost model as it is now",
        "",
        "`benchmarks/steps/loop_scoreboard.py` re-makes, on the CPU, the prediction of every "
        "fix in every loop timed on each GPU kind (the measured savings stay those of the GPU "
        "runs, each folder's own at the date it ran), and judges each fix the audit prices at "
        "1% of the step or more against predicted / measured within 0.5-2x and a positive "
        'measured saving; "within noise" where the run\'s rounds did not agree on the '
        "saving's sign. \"On the run's host\": the profile's host rates scaled to the host "
        "the run had (its issue time of the step as given against the audit's), as the loop "
        "itself predicts (that scale, by mode, is the table's second-last column: the hosts "
        "lent with one GPU kind differ by up to 2x from lease to lease, and from the host "
        "the profile's rates were measured on). Many loops are the same model and mode timed "
        "again on later code, on other hosts: each timing counts once.",
        "",
        *md_table(head, rows),
        "",
        "By fix (judged: meet / miss / within noise; on the profile's host, on the run's):",
        "",
        *md_table(("GPU", "fix", "timed", "judged", "on the run's host"), fix_rows),
        "",
        "The fixes that miss on the run's host, ms a step:",
        "",
        *md_table(
            ("GPU", "folder", "model", "mode", "fix", "predicted", "measured"), miss_rows, right=2
        ),
        "",
    ]
