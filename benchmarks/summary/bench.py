"""The `gpushape bench` section (bench-h200/): training steps side by side and the loop, each
fix's predicted saving beside the measured one; and the README's case-study table."""

from __future__ import annotations

import csv
import json

from .common import RESULTS, link, md_table
from .compile_steps import cache_and_roofline, compile_pad, why_bert_compile
from .loops_lib import loops_lib_section
from .scoreboard import scoreboard_section

FOLDER = "bench-h200"
CASES = {  # model as run -> (name, its variants file, its loop file)
    "torchvision.models:resnet50": ("ResNet-50 (torchvision, NCHW, 256 x 224^2)", "resnet50"),
    "hf:gpt2": ("GPT-2 124M (Hugging Face, 8 x 1024)", "gpt2"),
    "hf:bert": ("BERT-base MLM (Hugging Face, 32 x 512, fused AdamW)", "bert"),
}


def rows(name: str) -> list[dict]:
    with (RESULTS / FOLDER / name).open(newline="") as f:
        return list(csv.DictReader(f))


def _rate(r: dict) -> str:
    tokens = r.get("tokens_per_s")
    return f"{float(tokens):,.0f} tok/s" if tokens else f"{float(r['samples_per_s']):,.0f} img/s"


def _num(text: str, digits: int = 2) -> str:
    return "-" if text in ("", None) else f"{float(text):,.{digits}f}"


def _with_batch(name: str, batch: str) -> str:
    """A case's name with the batch the row ran ("16x1024:int64" -> "16 x 1024") in place of
    the default one it names."""
    shape = batch.split(":")[0].split(",")[0]
    if "(" not in name or not shape:
        return name
    head, _, rest = name.partition("(")
    parts = [p.strip() for p in rest.rstrip(")").split(",")]
    parts = [" x ".join(shape.split("x")) if " x " in p else p for p in parts]
    return f"{head}({', '.join(parts)})"


def variants_table() -> list[str]:
    body = []
    for r in rows("bench.csv"):
        name = _with_batch(CASES.get(r["model"], (r["model"],))[0], r.get("batch", ""))
        body.append(
            (
                name,
                f"`{r['variant']}`",
                _num(r["median_ms"]),
                _rate(r),
                _num(r["speedup_vs_baseline"]),
                _num(r["warmup_s"], 1),
                _num(r["peak_memory_gb"], 1),
                r["kernels_per_step"] or "-",
                f"{_num(r['mfu_pct'], 1)}%",
                r["bound"],
            )
        )
    head = ("model", "variant", "step ms", "rate", "x eager", "warm-up s", "peak GB")
    return md_table((*head, "kernels", "MFU", "bound"), body, right=8)


def loop_table() -> list[str]:
    body = [
        (
            CASES.get(r["model"], (r["model"],))[0],
            f"`{r['fix']}`",
            r["places"],
            _num(r["predicted_wall_ms"], 3),
            _num(r["measured_wall_ms"], 3),
            _num(r["predicted_over_measured"]),
            _num(r["step_ms_after"]),
        )
        for r in rows("loop.csv")
    ]
    head = ("model", "fix", "places", "predicted ms", "measured ms", "pred/meas")
    return md_table((*head, "step ms after"), body, right=5)


def loop_speedups() -> dict[str, tuple[float, float, float]]:
    """model -> (step as given, step after every fix, ratio), from the loop files."""
    out = {}
    for model, (_, stem) in CASES.items():
        data = json.loads((RESULTS / FOLDER / f"loop-{stem}.json").read_text())
        stages = list(data["stages"].values())
        first, last = stages[0]["median_s"], stages[-1]["median_s"]
        out[model] = (first, last, first / last)
    return out


def host_bound() -> list[str]:
    """Where the host sets the pace: optimized steps whose GPU time fell and wall clock did not,
    and the host's own time to issue a step (steps-h200/host_validate.json)."""
    bert = json.loads((RESULTS / FOLDER / "bert.json").read_text())["variants"]
    effnet = json.loads((RESULTS / FOLDER / "effnet.json").read_text())["variants"]
    host = json.loads((RESULTS / "steps-h200/host_validate.json").read_text())["results"]
    small = [r for r in host["rows"] if "error" not in r and r["batch"][0][0] == 2]

    def busy(v: dict) -> str:
        return f"{v['gpu_busy_s'] * 1e3:.1f}"

    issue = ", ".join(
        f"{r['model']} {r['measured_issue_s'] * 1e3:.1f} ms (predicted "
        f"{r['predicted_host_s'] * 1e3:.1f})"
        for r in small
    )
    e, o = bert["eager"], bert["optimize"]
    ee, eo, ec = effnet["eager"], effnet["optimize"], effnet["channels-last"]
    sets = _host_fixes("host_fixes-sets.json")
    single = _host_fixes("host_fixes-single.json")
    chain = json.loads((RESULTS / "steps-h200/host_by_size.json").read_text())["results"]
    chain = chain["cublaslt"]["16384"]["norm chain"]
    native, fused = (
        chain[k]["forward+backward"] * 1e6 for k in ("add + layer_norm", "AddLayerNorm")
    )
    layers = json.loads((RESULTS / FOLDER / "bert.json").read_text())["optimize"]["optimize"]
    graphed = layers.get("measured_s", {}).get("graph-layers")
    loop = json.loads((RESULTS / FOLDER / "loop-bert.json").read_text())["fixes"]
    fna_gpu = next(f["measured_gpu_s"] for f in loop if f["fix"] == "fuse-norm-act") * 1e3
    mlh = "pad-channels+masked-lm-head"
    fna = "pad-channels+fuse-norm-act+masked-lm-head"
    return [
        "Where the host sets the pace. The host of this machine takes tens of milliseconds to "
        "issue an eager training step whatever the batch: forward, loss and backward at batch "
        f"2 ({link('steps-h200/host_validate.json', 'host_validate.json')}, "
        f"`benchmarks/steps/host_validate.py`; predicted by the host model from the probe's "
        f"per-class rates in brackets): {issue}. So fixes that shorten the GPU's work stop "
        "paying once the GPU's time falls below that. BERT-base at 32 x 512, each set of "
        "transforms timed against eager in one run "
        f"({link('steps-h200/host_fixes-sets.json', 'host_fixes-sets.json')}, "
        f"{link('steps-h200/host_fixes-single.json', 'host_fixes-single.json')}, "
        "`benchmarks/steps/host_fixes.py`): eager "
        f"{sets['eager']:.1f} ms; masked-lm-head alone {single['masked-lm-head']:.1f}; with "
        f"the vocabulary padded {sets[mlh]:.1f}; adding fuse-norm-act makes it slower, "
        f"{sets[fna]:.1f} ms, though it takes {fna_gpu:.1f} ms off the GPU's work "
        f"({link('bench-h200/loop-bert.json', 'loop-bert.json')}), because gpushape's "
        f"AddLayerNorm costs the host {fused:.0f} us a site forward and backward against "
        f"{native:.0f} us for PyTorch's add and layer_norm "
        f"({link('steps-h200/host_by_size.json', 'host_by_size.json')}, a chain of 24 sites "
        "at 16,384 x 768). graph-layers takes the layers' host cost away: optimize captures "
        "BERT's 12 layers where their eager forward and backward is host-bound"
        + (
            f" (timed by optimize on the GPU: {graphed[0] * 1e3:.1f} ms eager, "
            f"{graphed[1] * 1e3:.1f} ms replayed)"
            if graphed
            else ""
        )
        + f", and the optimized step takes {o['median_s'] * 1e3:.1f} ms against "
        f"{e['median_s'] * 1e3:.1f} eager with the GPU busy {busy(o)} ms of it "
        f"({o['busy_fraction']:.0%}, GPU-bound). EfficientNet-B0 at batch 64 went "
        f"{ee['median_s'] * 1e3:.1f} ms eager, "
        f"{ec['median_s'] * 1e3:.1f} channels-last (GPU busy {busy(ec)} ms), "
        f"{eo['median_s'] * 1e3:.1f} optimized (GPU busy {busy(eo)} ms): gpushape's fused "
        "BatchNorm kernels cost the host more per call than PyTorch's, which a host-bound step "
        "pays for. The audit's eager step takes the longer of the GPU's time and the host's, "
        "and optimize rolls back a rewrite predicted to lengthen the wall clock.",
        "",
        "Peak memory of a variant that replays CUDA graphs (`graph`, `compile-graphs`, and "
        "`optimize` where graph-layers was kept) in these runs counts only the tensors alive "
        "outside the graphs' private memory pools, so it reads low; `gpushape bench` now adds "
        "the pools' working memory (their free bytes between replays).",
        "",
    ]


def host_model() -> list[str]:
    """The host model against real models' eager steps, before and after the two rates fitted
    on them (steps-h200/host_by_op.json, host_glue_fit.json)."""
    fit = json.loads((RESULTS / "steps-h200/host_glue_fit.json").read_text())["results"]
    glue, acc = fit["rates"]["module_glue"], fit["rates"]["accumulate_grad"]
    by_op = [r for r in fit["rows"] if r["host"] == "host_by_op"]
    other = [r for r in fit["rows"] if r["host"] == "host_validate"]

    def span(rows: list[dict], key: str) -> str:
        values = [r[key] for r in rows]
        return f"{min(values):.2f}-{max(values):.2f}"

    per = ", ".join(f"{k} {v * 1e6:.0f}" for k, v in glue["per_model"].items())
    return [
        "The host model on real models. Timed op by op on the H200's host "
        f"({link('steps-h200/host_by_op.json', 'host_by_op.json')}, "
        "`benchmarks/steps/host_by_op.py`, batch 2, forward and backward apart), the "
        "forwards of library models issued slower than their ops priced at the probe's rates: "
        f"predicted / measured {span(by_op, 'forward_before')}. What the bare rates miss is "
        "each module's own Python (attribute lookups, shape "
        "arithmetic, a library's argument handling) and the engine's node per parameter: "
        f"fitted on these models ({link('steps-h200/host_glue_fit.json', 'host_glue_fit.json')}, "
        f"`benchmarks/steps/fit_host_glue.py`), a module call costs {glue['seconds'] * 1e6:.1f} "
        f"us beyond its ops (per model, us: {per}) and a gradient leaf "
        f"{acc['seconds'] * 1e6:.1f} us. With both, the forwards come to "
        f"{span(by_op, 'forward_after')} (each model's forward with the rate fitted on the "
        f"other four: {span(by_op, 'forward_left_out')}) and whole steps from "
        f"{span(by_op, 'step_before')} to {span(by_op, 'step_after')}; the small-batch steps "
        f"timed on another lease's host (host_validate.json) go from {span(other, 'step_before')}"
        f" to {span(other, 'step_after')}. The same model's step issued up to "
        f"{_host_spread(by_op, other):.1f}x faster on one lent host than on the other, which "
        "bounds what any one set of rates can promise; `gpushape probe` measures both rates "
        "on the machine it runs on. Both runs timed each model after the models before it "
        "had been profiled in the same process; whether a profiler session leaves the host's "
        "dispatch slower is not yet measured (host_by_op.py now times every model before any "
        "profiler runs, and the first again at the end).",
        "",
    ]


def _host_spread(by_op: list[dict], other: list[dict]) -> float:
    here = {r["model"]: r["step_ms"] for r in by_op}
    ratios = [max(here[r["model"]], r["step_ms"]) / min(here[r["model"]], r["step_ms"])
              for r in other if r["model"] in here]  # fmt: skip
    return max(ratios)


def _host_fixes(name: str) -> dict[str, float]:
    data = json.loads((RESULTS / "steps-h200" / name).read_text())["results"]["variants"]
    return {k: v["median_ms"] for k, v in data.items()}


def bench_section() -> list[str]:
    env = rows("bench.csv")[0]
    plots = ", ".join(
        link(f"{FOLDER}/{p}.png", p)
        for _, (_, stem) in CASES.items()
        for p in (stem, f"loop-{stem}")
    )
    return [
        "## gpushape bench",
        "",
        f"`gpushape bench MODEL --vs ...` and `gpushape bench MODEL --optimize` on "
        f"{env['gpu']}, torch {env['torch']}, triton {env['triton']} "
        f"({link(FOLDER + '/bench.csv', 'bench.csv')}, {link(FOLDER + '/loop.csv', 'loop.csv')}; "
        f"the commands are in each row; plots: {plots}). bf16 training steps on synthetic data "
        "(token ids over the vocabulary, 15% masked for BERT), the optimizer as PyTorch builds "
        "it (SGD with momentum for ResNet-50, AdamW for GPT-2, fused AdamW for BERT); variants "
        "alternated in 5 rounds of 10-step blocks, medians of CUDA-event timings. Warm-up counts "
        "from building the variant (rewrites, checks, compilation, capture) to the end of its "
        "first 3 steps; it includes compiling gpushape's Triton kernels where a variant uses "
        "them first in the process (ResNet-50's `optimize`: its `optimize+graph`, built next "
        "with the same rewrites, checks and a capture besides, took seconds).",
        "",
        *variants_table(),
        "",
        "The loop (`--optimize`): each fix applied on top of the ones above it, its saving "
        "predicted by the audit of each stage's model and measured as the step-time "
        "difference:",
        "",
        *loop_table(),
        "",
        *loops_lib_section(),
        *scoreboard_section(),
        *other_runs(),
        *why_bert_compile(),
        *compile_pad(),
        *cache_and_roofline(),
        *host_bound(),
        *host_model(),
    ]


OTHER_RUNS = (
    ("bert-compile-graphs.json", "BERT-base MLM, an earlier run (before the GEMV bias gradients)"),
    ("bert-caller-backward.json", "BERT-base MLM, with the backward on the calling thread"),
    (
        "resnet50-caller-backward.json",
        "ResNet-50, with the backward on the calling thread (before the shortcut BatchNorms "
        "ran on the kernel)",
    ),
    (
        "resnet50-slow-host.json",
        "ResNet-50 on a slower host (the optimized step's Python took 1.7x as long), before "
        "graph-layers timed its layers without a loss",
    ),
    ("gpt2-slow-host.json", "GPT-2 on that slower host"),
    (
        "resnet50-graph-layers.json",
        "ResNet-50, graph-layers kept by optimize (since then it needs 3%)",
    ),
)


def other_runs() -> list[str]:
    """The same day's other runs of the case studies: each variant's median and p10-p90, and
    what graph-layers measured or why it was refused (bench-h200/*.json beside the table's)."""
    out = [
        "Other runs of the same cases that day, each a separate process (median ms, p10-p90 in "
        "brackets, x its own eager step); they show how far an eager step's median moves from "
        "one run to the next on this host:",
        "",
    ]
    for name, what in OTHER_RUNS:
        data = json.loads((RESULTS / FOLDER / name).read_text())
        v = data["variants"]
        eager = v["eager"]["median_s"]
        cells = [
            f"`{k}` {r['median_s'] * 1e3:.2f} ({r['p10_s'] * 1e3:.2f}-{r['p90_s'] * 1e3:.2f}, "
            f"{eager / r['median_s']:.2f}x)"
            for k, r in v.items()
            if k != "eager"
        ]
        report = (data.get("optimize") or {}).get("optimize") or {}
        layers = report.get("measured_s", {}).get("graph-layers")
        why = [r["reason"] for r in report.get("refused", []) if r["transform"] == "graph-layers"]
        note = (
            f"; graph-layers timed the layers {layers[0] * 1e3:.2f} ms eager, "
            f"{layers[1] * 1e3:.2f} replayed"
            if layers
            else f"; graph-layers refused: {why[0]}"
            if why
            else ""
        )
        out.append(
            f"- {what} ({link(f'{FOLDER}/{name}', name)}, {data['environment']['date_utc']}): "
            f"eager {eager * 1e3:.2f}; {'; '.join(cells)}{note}."
        )
    return [*out, ""]
