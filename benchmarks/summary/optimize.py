"""The gpushape.optimize section (optimize-h200/): models as written against the same models
through `gpushape.optimize`, the transforms it applied and the audit's predicted step."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from .common import environment_line, link, load, md_table, ms, ratio

FINAL = "optimize-h200/bench_optimize.json"
CL_INPUT = "optimize-h200/bench_optimize_cl_input.json"
FIRST = "optimize-h200/bench_optimize_first.json"
README = "optimize-h200/README.md"
BASE = "as written"


def variants_table(case: dict, predicted: bool = True) -> list[str]:
    """One row per variant: samples/s, speed-up over the model as written, the median step and
    (with `predicted`) the audit's predicted step at the benchmark's batch."""
    full = case.get("optimize", {}).get("predicted_full_batch_s", {}) if predicted else {}
    head = ["variant", "samples/s", "speed-up vs as written", "step ms"]
    head += ["predicted step ms"] if full else []
    rows = []
    for name, v in case["variants"].items():
        row = [
            name,
            f"{v['samples_per_s']:,.0f}",
            f"{v['speedup_vs_as_written']:.2f}x",
            ms(v["median_step_s"], 2),
        ]
        row += [ms(full.get(name), 2)] if full else []
        rows.append((*row, f"{v['warmup_s']:.1f}"))
    return md_table([*head, "warm-up s"], rows, right=len(head))


def _details(applied: list[dict]) -> str:
    """What one transform did, its rewrites grouped by detail (shapes left out), with counts."""
    counts = Counter(re.sub(r" \([\d, ]+\)", "", a["detail"]) for a in applied)
    if len(applied) <= 2:
        return "; ".join(f"`{a['module'] or 'inputs'}`: {a['detail']}" for a in applied)
    return "; ".join(f"{n} x {d}" for d, n in counts.items())


def transforms_table(opt: dict) -> list[str]:
    by: dict[str, list[dict]] = {}
    for a in opt["applied"]:
        by.setdefault(a["transform"], []).append(a)
    rows = []
    for tid, applied in by.items():
        check = opt["verified"].get(tid, {})
        verdict = "passed" if check.get("passed") else "failed"
        rows.append(
            (
                f"`{tid}`",
                len(applied),
                _details(applied),
                ms(opt["predicted_saving_s"].get(tid), 2),
                f"{verdict}, {check.get('checked', 0)} tensors; closest to its bound: "
                f"{check.get('worst') or '-'}",
            )
        )
    return md_table(
        ("transform", "rewrites", "what", "predicted saving ms", "check against the original"),
        rows,
    )


def _not_applied(opt: dict) -> str:
    def names(items: list[dict], why: str) -> str:
        if not items:
            return "nothing"
        return ", ".join(
            f"`{i['transform']}` ({i.get(why) or '-'}; predicted saving "
            f"{ms(opt['predicted_saving_s'].get(i['transform']), 2)} ms)"
            for i in items
        )

    return (
        f"Not applied: {names(opt['skipped'], 'reason')}. Refused: "
        f"{names(opt['refused'], 'reason')}. Rolled back: {names(opt['rolled_back'], 'reason')}."
    )


def case_section(case: dict) -> list[str]:
    opt = case["optimize"]
    v = case["variants"]
    full = opt.get("predicted_full_batch_s", {})
    out = [
        f"### {case['case']}",
        "",
        f"{case['samples_per_step']:,} samples a step; `gpushape.optimize` took "
        f"{opt['optimize_s']:.1f} s (audit, rewrites and checks).",
        "",
        *variants_table(case),
        "",
    ]
    if BASE in full and "gpushape.optimize" in full:
        out += [
            f"The audit predicted {ratio(full[BASE], full['gpushape.optimize'])}x "
            f"({ms(full[BASE], 1)} -> {ms(full['gpushape.optimize'], 1)} ms); the step measured "
            f"{v['gpushape.optimize']['speedup_vs_as_written']:.2f}x.",
            "",
        ]
    out += [
        "The transforms applied, each checked against the original (outputs and every "
        "parameter's gradient) on the small batch the benchmark hands `optimize`, where the audit "
        f"predicted {ms(opt['predicted_step_before_s'], 2)} -> "
        f"{ms(opt['predicted_step_after_s'], 2)} ms a step; the savings are at that batch:",
        "",
        *transforms_table(opt),
        "",
        _not_applied(opt),
        "",
    ]
    return out


def _weights_only(case: dict) -> bool:
    """Whether channels-last converted the weights alone (no forward pre-hook on the inputs)."""
    cl = [a for a in case["optimize"]["applied"] if a["transform"] == "channels-last"]
    return bool(cl) and all(a["module"] for a in cl)


def earlier_runs() -> list[str]:
    data = load(CL_INPUT)
    case = data["results"][0]
    fed = case["variants"]
    nchw, cl = fed["gpushape.optimize"], fed["gpushape.optimize, channels_last input"]
    weights = "the weights only" if _weights_only(case) else "weights and inputs"
    first = load(FIRST)
    final = {c["case"]: c for c in load(FINAL)["results"]}
    rows = []
    for c in first["results"]:
        then, now = c["variants"], final.get(c["case"], {}).get("variants", {})
        for name, t in then.items():
            n = now.get(name)
            rows.append(
                (
                    c["case"],
                    name,
                    f"{t['samples_per_s']:,.0f}",
                    "-" if not n else f"{n['samples_per_s']:,.0f}",
                    f"{t['warmup_s']:.1f}",
                    "-" if not n else f"{n['warmup_s']:.1f}",
                )
            )
    compiled = next(
        (v for c in first["results"] if (v := c["variants"].get("torch.compile, channels_last"))),
        None,
    )
    now_converts = not any(_weights_only(c) for c in final.values() if "ResNet" in c["case"])
    before = (
        "before channels-last converted the inputs"
        if _weights_only(first["results"][0])
        else "an earlier run"
    )
    out = [
        "### Channels_last inputs, and the first run",
        "",
        f"{link(CL_INPUT, Path(CL_INPUT).name)} ({link(CL_INPUT.replace('.json', '.log'), 'log')}; "
        f"{environment_line(data['environment'])}) fed "
        f"the optimized ResNet-50, whose channels-last rewrite then converted {weights}, NCHW "
        "images and channels_last images in one run:",
        "",
        *variants_table(case, predicted=False),
        "",
        f"Fed channels_last, its step ran {ratio(cl['samples_per_s'], nchw['samples_per_s'])}x "
        "as fast as fed NCHW"
        + (
            ": the channels-last transform now converts the model's 4-D inputs too (the "
            "forward pre-hook among ResNet-50's rewrites above)."
            if now_converts
            else "."
        ),
        "",
        f"{link(FIRST, Path(FIRST).name)} ({link(FIRST.replace('.json', '.log'), 'log')}; "
        f"{environment_line(first['environment'])}) is the "
        f"same benchmark, {before}; samples/s and warm-up against the final run:",
        "",
        *md_table(
            (
                "case",
                "variant",
                "first samples/s",
                "final samples/s",
                "first warm-up s",
                "final warm-up s",
            ),
            rows,
            right=4,
        ),
        "",
    ]
    if compiled:
        out += [
            f"torch.compile's warm-up of {compiled['warmup_s']:.1f} s in the first run is a "
            "cold compilation; the final run on the same machine found Inductor's cache.",
            "",
        ]
    return out


def optimize_section() -> list[str]:
    data = load(FINAL)
    rounds = {len(v["step_times_s"]) for c in data["results"] for v in c["variants"].values()}
    out = [
        "## gpushape.optimize",
        "",
        f"`benchmarks/transforms/bench_optimize.py` ({link(FINAL, Path(FINAL).name)}, "
        f"{link(FINAL.replace('.json', '.log'), 'log')}; {link(README, 'what each file is')}): "
        f"{environment_line(data['environment'])}. One training step (forward, backward, "
        "optimizer step, bf16, synthetic data on the GPU) of each model as written against "
        "the same model through `gpushape.optimize`, which applies the fixes its audit finds "
        "for this GPU and keeps a rewrite only if the model still computes the same; for "
        "ResNet-50 also torch.compile of the original in channels_last, the usual fix by hand. "
        "Eager steps are timed as a user runs them (the host's launches included), the "
        f"variants alternated over {'/'.join(map(str, sorted(rounds)))} rounds; step: the "
        "median. Predicted step: the audit's (kernels and launches on the H200) for the model "
        "as written and as optimized, at the benchmark's batch. GPT-2's samples are tokens.",
        "",
    ]
    for case in data["results"]:
        out += case_section(case)
    return out + earlier_runs()
