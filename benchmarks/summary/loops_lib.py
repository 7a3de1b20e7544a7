"""The loop on library models (bench-h200/loop-lib.csv and the loop-<model>-<mode>.json beside
it): every fix the audit named on timm and Hugging Face models, in eager and in compile mode,
applied one after another and timed, its predicted wall-clock saving beside the measured one.

A fix counts against the advice's target (predicted / measured wall saving within 0.5-2x, no
measured saving <= 0) where the audit graded it high or medium: its predicted wall saving at
least 1% of the audit's predicted step (the severities' time shares). graph-layers is kept by
optimize on a timing, not from a finding, and is shown but not judged."""

from __future__ import annotations

import csv
import json

from .common import RESULTS, link, md_table

FOLDER = "bench-h200"
CSV = "loop-lib.csv"
# later runs of the loop, each a folder holding its loop-lib.csv and JSONs: (folder, what ran)
LATER = (
    (
        "loops-h200-2",
        "a second lease, on the code after the first run's changes (the eager loops of the "
        "other five models and the compiled loops of Swin-T and BERT ran on that lease too, "
        "but their files did not come back: the call's own packing step overwrote them)",
    ),
    (
        "loops-h200-3",
        "a third lease, with no-kv-cache (GPT-2's loop put graph-layers before it, where the "
        "key/value cache kept it from capturing anything and the stage was priced with the "
        "captured step's all-true mask: both fixed since)",
    ),
    (
        "loops-h200-4",
        "a fourth lease, on the code with both fixed: GPT-2's eager loop, and the compiled "
        "loops of MobileNetV3 and EfficientNet-B0",
    ),
    (
        "loops-h200-5",
        "a fifth lease: BERT's eager loop, and the compiled loops of ViT-B/16, GPT-2, "
        "ConvNeXt-T, Swin-T and the LLaMA-style model (whose last stage Dynamo ran eager: "
        "its recompile limit, raised since; see the folder's README)",
    ),
)
BAND = (0.5, 2.0)
MEDIUM_SHARE = 0.01  # auditing/finding.py's time-share threshold for medium
NOT_FROM_FINDINGS = ("graph-layers",)


def _rows(folder: str = FOLDER) -> list[dict]:
    path = RESULTS / folder / CSV
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _stem(model: str) -> str:
    return "".join("_" if c in ":/?&=" else c for c in model)


def _loop(model: str, mode: str, folder: str = FOLDER) -> dict:
    return json.loads((RESULTS / folder / f"loop-{_stem(model)}-{mode}.json").read_text())


def _spread(loop: dict, fix: str) -> str:
    """The lowest and highest saving of a single round (ms), from the stages' round times,
    and whether the rounds settle the saving's sign (the loop's sign test)."""
    from gpushape.steps.fix_by_fix import sign_settled

    names = list(loop["stages"])
    stage = f"+ {fix}"
    if stage not in names or names.index(stage) == 0:
        return "-"
    before = loop["stages"][names[names.index(stage) - 1]]["step_times_s"]
    saved = [(a - b) * 1e3 for a, b in zip(before, loop["stages"][stage]["step_times_s"])]
    if len(saved) < 2:
        return "-"
    noise = "" if sign_settled(saved) else " (within noise)"
    return f"{min(saved):.2f}..{max(saved):.2f}{noise}"


def judged(r: dict, step_ms: float) -> str:
    """'meets', 'misses' or '-' (not a high or medium finding's fix) for one loop row."""
    pred, meas = float(r["predicted_wall_ms"]), float(r["measured_wall_ms"])
    if r["fix"] in NOT_FROM_FINDINGS or pred < MEDIUM_SHARE * step_ms:
        return "-"
    if meas <= 0:
        return "misses (measured <= 0)"
    return "meets" if BAND[0] <= pred / meas <= BAND[1] else "misses"


RECHECK = "loop-lib-recheck.json"


def _recheck(folder: str = FOLDER) -> dict[tuple[str, str, str], dict]:
    """(model, mode, fix) -> the re-prediction of benchmarks/steps/recheck_loops.py, if run."""
    path = RESULTS / folder / RECHECK
    if not path.exists():
        return {}
    loops = json.loads(path.read_text())["results"]
    return {(r["model"], r["mode"], r["fix"]): r for c in loops for r in c["rows"]}


def _now(again: dict | None, step_ms: float) -> tuple[str, str]:
    """The re-predicted wall saving (ms) and its verdict, judged as the run's."""
    if again is None:
        return "-", "-"
    pred, meas = again["predicted_wall_s"] * 1e3, again["measured_wall_s"] * 1e3
    row = {"fix": again["fix"], "predicted_wall_ms": pred, "measured_wall_ms": meas}
    return f"{pred:.3f}", judged(row, again["step_predicted_s"] * 1e3 or step_ms)


def table() -> tuple[list[str], dict[str, int]]:
    body, counts, again = [], {"meets": 0, "misses": 0, "now meets": 0, "now misses": 0}, _recheck()
    for r in _rows():
        loop = _loop(r["model"], r["mode"])
        step_ms = loop["predicted_step_s"] * 1e3
        verdict = judged(r, step_ms)
        if verdict != "-":
            counts["meets" if verdict == "meets" else "misses"] += 1
        now, now_verdict = _now(again.get((loop["model"], r["mode"], r["fix"])), step_ms)
        if now_verdict != "-":
            counts["now meets" if now_verdict == "meets" else "now misses"] += 1
        body.append((*_saving_cells(r), *_gpu_cells(r), verdict, now, now_verdict))
    head = ("model", "mode", "fix", "places", "predicted ms", "measured ms", "GPU predicted ms")
    tail = ("GPU measured ms", "pred/meas", "0.5-2x", "re-predicted ms", "0.5-2x re-predicted")
    return md_table((*head, *tail), body, right=9), counts


def _saving_cells(r: dict) -> tuple:
    """A loop row's model, mode, fix, places, predicted and measured wall saving (ms)."""
    pred, meas = float(r["predicted_wall_ms"]), float(r["measured_wall_ms"])
    return r["model"], r["mode"], f"`{r['fix']}`", r["places"], f"{pred:.3f}", f"{meas:.3f}"


def _gpu_cells(r: dict) -> tuple:
    """Its predicted and measured GPU saving (ms), and predicted / measured wall saving."""
    ratio = r["predicted_over_measured"]
    return (
        f"{float(r['predicted_gpu_ms']):.3f}",
        f"{float(r['measured_gpu_ms']):.3f}" if r["measured_gpu_ms"] else "-",
        ratio if ratio not in ("", None) else "-",
    )


def _here(again: dict | None, step_ms: float, noise: bool) -> tuple[str, str]:
    """The wall saving re-predicted on the run's own host (steps/host_here.py) and its
    verdict, judged as the run's."""
    if again is None or again.get("predicted_here_wall_s") is None:
        return "-", "-"
    pred = again["predicted_here_wall_s"] * 1e3
    row = {"fix": again["fix"], "predicted_wall_ms": pred,
           "measured_wall_ms": again["measured_wall_s"] * 1e3}  # fmt: skip
    verdict = judged(row, again["step_predicted_s"] * 1e3 or step_ms)
    return f"{pred:.3f}", "within noise" if noise and verdict != "-" else verdict


def later_table(folder: str) -> tuple[list[str], dict[str, int]]:
    """A later run's rows, judged as the first run's, with each fix's single-round spread, and
    where recheck_loops.py ran on the folder, re-predicted now and on the run's own host."""
    body = []
    counts = {k: 0 for k in ("meets", "misses", "within noise", "now meets", "now misses",
                             "here meets", "here misses")}  # fmt: skip
    again = _recheck(folder)
    for r in _rows(folder):
        loop = _loop(r["model"], r["mode"], folder)
        step_ms = loop["predicted_step_s"] * 1e3
        noise = _spread(loop, r["fix"]).endswith("(within noise)")
        verdict = judged(r, step_ms)
        if verdict != "-" and noise:
            verdict = "within noise"
        if verdict != "-":
            counts[verdict if verdict in counts else "misses"] += 1
        cells = (*_saving_cells(r), _spread(loop, r["fix"]), *_gpu_cells(r), verdict)
        if again:
            row_again = again.get((loop["model"], r["mode"], r["fix"]))
            now, now_verdict = _now(row_again, step_ms)
            here, here_verdict = _here(row_again, step_ms, noise)
            for key, v in (("now", now_verdict), ("here", here_verdict)):
                if v in ("meets", "misses") or v.startswith("misses"):
                    counts[f"{key} {'meets' if v == 'meets' else 'misses'}"] += 1
            cells += (now, now_verdict, here, here_verdict)
        body.append(cells)
    head = ("model", "mode", "fix", "places", "predicted ms", "measured ms", "single rounds ms")
    tail = ("GPU predicted ms", "GPU measured ms", "pred/meas", "0.5-2x")
    if again:
        tail += ("re-predicted ms", "0.5-2x", "on its host ms", "0.5-2x")
    return md_table((*head, *tail), body, right=10), counts


def later_sections() -> list[str]:
    out = []
    for folder, what in LATER:
        rows = _rows(folder)
        if not rows:
            continue
        env = rows[0]
        body, counts = later_table(folder)
        rounds = sorted({r["command"].split("--rounds ")[1].split()[0] for r in rows})
        out += [
            f"The loop again, on {what} ({env['date_utc'][:10]}, {env['gpu']}, torch "
            f"{env['torch']}, triton {env['triton']}, `--rounds {'/'.join(rounds)}`; "
            f"{link(folder + '/' + CSV, folder + '/' + CSV)}, one JSON per model and mode "
            "beside it). Each fix also shows the lowest and highest saving of a single round "
            "(the stages alternate round by round, so round i of a stage and of the one "
            "before it ran side by side), within noise where too few rounds agree in sign to "
            "settle it (a sign test at 5%: five of five, seven of eight). Of the fixes of high "
            "and medium findings, "
            f"{counts['meets']} meet the band, {counts['misses']} miss it and "
            f"{counts['within noise']} are within noise. These predictions were made by the "
            "run itself, with the cost model as committed before it."
            + (
                " The last four columns re-predict the same steps on the CPU with the cost "
                "model as it is now (`benchmarks/steps/recheck_loops.py`, "
                f"{link(folder + '/' + RECHECK, RECHECK)}; {counts['now meets']} meet, "
                f"{counts['now misses']} miss), and again with the profile's host rates scaled "
                "to the run's own host, its issue time of the step as given over the audit's "
                f"(`steps/host_here.py`, as the loop now does; {counts['here meets']} meet, "
                f"{counts['here misses']} miss). The cost model was changed after these runs, "
                "partly on what they showed, so the re-predictions are in-sample."
                if _recheck(folder)
                else ""
            ),
            "",
            *body,
            "",
            *stages(folder),
            "",
        ]
    return out


def stages(folder: str = FOLDER) -> list[str]:
    """Each stage's step: median, GPU busy and the host's issue time, which side bound it."""
    lines, seen = [], set()
    for r in _rows(folder):
        key = (r["model"], r["mode"])
        if key in seen:
            continue
        seen.add(key)
        loop = _loop(*key, folder)
        parts = [
            f"{name} {s['median_s'] * 1e3:.1f} (GPU {s['gpu_busy_s'] * 1e3:.1f}, host "
            f"{s['issue_s'] * 1e3:.1f}{_held(s)})"
            for name, s in loop["stages"].items()
        ]
        pred = loop["predicted_step_s"] * 1e3
        lines.append(f"- {key[0]}, {key[1]} (predicted {pred:.1f} ms as given): {'; '.join(parts)}")
    return lines


def _held(stage: dict) -> str:
    """The host's own time with the GPU held busy, where the run measured it."""
    held = stage.get("host_s")
    return f", {held * 1e3:.1f} with the GPU held" if held is not None else ""


def loops_lib_section() -> list[str]:
    rows = _rows()
    if not rows:
        return []
    env = rows[0]
    body, counts = table()
    return [
        "### The loop on timm and Hugging Face models",
        "",
        f"`gpushape bench MODEL --optimize --mode eager|compile --rounds 3` on {env['gpu']}, "
        f"torch {env['torch']}, triton {env['triton']} ({link(FOLDER + '/' + CSV, CSV)}, one "
        "JSON per model and mode beside it; each row has its command): each fix the audit "
        "named, applied on top of the ones above it, its predicted wall-clock saving beside "
        "the measured step-time difference (bf16, SGD for timm, AdamW for GPT-2, fused AdamW "
        "for BERT at 32 x 512; models at their default batches). The last column judges a "
        "fix the audit priced at 1% of the step or more (a high or medium finding) against "
        "predicted / measured within 0.5-2x and a positive measured saving.",
        "",
        *body,
        "",
        f"Of the fixes of high and medium findings timed here, {counts['meets']} meet the band "
        f"and {counts['misses']} miss it, as the run predicted them. The last two columns "
        f"re-predict the same steps with the cost model as it is now "
        f"({link(FOLDER + '/' + RECHECK, RECHECK)}, `benchmarks/steps/recheck_loops.py`, on "
        "the CPU; the measured savings unchanged): "
        f"{counts['now meets']} meet and {counts['now misses']} miss. That model was changed "
        "after these runs, on what they showed (compile mode's host per kernel, Inductor's "
        "layout and padding, the masked math path in float32), so its fit here is in-sample; "
        "a new run judges it. Each stage, ms a step (median, GPU busy, host's issue time of "
        "one step, which for a GPU-bound step is about its GPU time: the host waits on the "
        "GPU once the launch queue fills):",
        "",
        *stages(),
        "",
        *later_sections(),
    ]
