"""Render Markdown from benchmark result files: tables for one file, or the whole results page.

    python benchmarks/summarize.py benchmarks/results/kernels-h200/bench_*.json   # tables
    python benchmarks/summarize.py docs > docs/results-h200.md                    # the page

Each result file is what `gpushape.bench.write_results` wrote: an "environment" (GPU, versions,
date, command), the "criteria" the issue sets with measured values and verdicts, and "results".
The `docs` mode renders docs/results-h200.md from everything under benchmarks/results/ and the
profile shipped for the H200 (src/gpushape/hardware/profiles/h200-sxm.json, itself a probe
result): every number on that page is read from those files, the prose around it is templates.
tests/test_summarize.py checks that the committed page is what this renders.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


# --- the results page ---------------------------------------------------------------------------


def _load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def _link(rel: str, text: str | None = None) -> str:
    """A link from docs/ to a result file (`rel` under benchmarks/results/)."""
    return f"[{text or rel}](../benchmarks/results/{rel})"


def _src(rel: str) -> str:
    return f"[`{rel}`](../{rel})"


def _table(head: Iterable[str], rows: Iterable[Iterable[object]], right: int = 0) -> list[str]:
    """A Markdown table; the last `right` columns are right-aligned."""
    head = list(head)
    align = ["---"] * (len(head) - right) + ["---:"] * right
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _ms(seconds: float | None, digits: int = 3) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def _ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    return "-" if a is None or not b else f"{a / b:.{digits}f}"


def _shape(shape: Iterable[int]) -> str:
    return "x".join(map(str, shape))


def _log_summary(rel: str) -> str:
    """The last line of a pytest log: 'N passed, ... in Ts'."""
    lines = [ln.strip() for ln in (RESULTS / rel).read_text().splitlines() if ln.strip()]
    return lines[-1].strip("= ")


def _header() -> list[str]:
    envs = []
    for path in sorted(RESULTS.rglob("*.json")):
        data = json.loads(path.read_text())
        env = data.get("environment") or data.get("env")
        if isinstance(env, dict) and env.get("gpu"):
            envs.append(env)
    gpus = sorted({f"{e['gpu']} ({e['sm_count']} SMs)" for e in envs})
    torches = sorted({e["torch"] for e in envs})
    tritons = sorted({e["triton"] for e in envs})
    dates = sorted(e["date_utc"] for e in envs)
    return [
        "# Measured on an H200",
        "",
        "<!-- Generated by benchmarks/summarize.py: do not edit by hand. -->",
        f"Regenerate with `{DOCS_COMMAND}` (tests/test_summarize.py fails when this page and "
        "the result files disagree). Every number below is read from a file under "
        "[`benchmarks/results/`](../benchmarks/results/) or from the profile gpushape ships "
        f"for the H200, {_src('src/gpushape/hardware/profiles/h200-sxm.json')}; each file "
        "records the GPU, versions, date and command that produced it.",
        "",
        f"GPU: {', '.join(gpus)}; torch {', '.join(torches)}, triton {', '.join(tritons)}; "
        f"{len(envs)} GPU result files dated {dates[0]} to {dates[-1]}. Times are medians of "
        "CUDA-event timings; baseline and candidate are alternated within one run.",
        "",
        "Contents: [probe](#the-probe-ceilings-and-cliffs), "
        "[eager kernels against the copy rate](#eager-kernels-against-the-copy-rate), "
        "[fused attention](#fused-attention-against-the-gemm-model), "
        "[the guide's claims](#the-design-guides-rules-of-thumb-on-this-h200), "
        "[cost model against the profiler](#cost-model-against-the-profiler), "
        "[audit savings against measurement](#the-audits-savings-against-measurement), "
        "[fused kernels](#fused-kernels), [examples](#examples), "
        "[test runs](#test-runs-on-the-h200), [tracing on a CPU](#tracing-speed-on-a-cpu).",
        "",
    ]


def _probe() -> list[str]:
    from gpushape.hardware import get_gpu

    full = _load("probe-h200/h200-sxm.json")
    quick = _load("probe-h200-quick/h200-sxm.json")
    spec = get_gpu(full["gpu"])
    fc, qc = full["ceilings"], quick["ceilings"]

    def tflops(c: dict, dtype: str, key: str = "gemm_flops") -> str:
        v = c.get(key, {}).get(dtype)
        return "-" if v is None else f"{v / 1e12:,.1f}"

    rows = [
        (
            "copy (read + write), GB/s",
            f"{fc['copy_bytes_per_s'] / 1e9:,.0f}",
            f"{qc['copy_bytes_per_s'] / 1e9:,.0f}",
            f"{spec.memory_bandwidth_bytes_per_s / 1e9:,.0f}",
            _ratio(fc["copy_bytes_per_s"], spec.memory_bandwidth_bytes_per_s),
        )
    ]
    for dtype in ("tf32", "fp16", "bf16", "fp8"):
        peak = spec.peak_flops(dtype)
        rows.append(
            (
                f"{dtype} GEMM, TFLOP/s",
                tflops(fc, dtype),
                tflops(qc, dtype),
                f"{peak / 1e12:,.1f}",
                _ratio(fc["gemm_flops"][dtype], peak),
            )
        )
    cuda32 = spec.peak_flops("fp32", tensor_cores=False)
    rows.append(
        (
            "fp32 GEMM on CUDA cores (TF32 off), TFLOP/s",
            tflops(fc, "fp32", "gemm_flops_cuda_cores"),
            tflops(qc, "fp32", "gemm_flops_cuda_cores"),
            f"{cuda32 / 1e12:,.1f}",
            _ratio(fc["gemm_flops_cuda_cores"]["fp32"], cuda32),
        )
    )
    for label, key in (("eager", "launch_overhead_s"), ("CUDA graph", "graph_launch_overhead_s")):
        rows.append(
            (
                f"kernel launch, {label}, us",
                f"{fc[key] * 1e6:.2f}",
                f"{qc[key] * 1e6:.2f}",
                "-",
                "-",
            )
        )
    rows.append(
        (
            "probe wall time, s",
            f"{full['probe']['timing']['total_s']:.0f}",
            f"{quick['probe']['timing']['total_s']:.0f}",
            "-",
            "-",
        )
    )
    out = [
        "## The probe: ceilings and cliffs",
        "",
        f"`gpushape probe` on the H200: the full run ({_link('probe-h200/probe-report.md')}, "
        f"profile {_link('probe-h200/h200-sxm.json', 'h200-sxm.json')}, plots beside it) and a "
        f"quick run on another machine later that day "
        f"({_link('probe-h200-quick/probe-report.md')}), which also measured the eager "
        "kernels' families and the attention kernels (the full run predates them). The "
        "datasheet column is gpushape's catalog entry.",
        "",
        *_table(
            ("measured", "full probe", "quick probe", "datasheet", "full / datasheet"),
            rows,
            right=4,
        ),
        "",
        "Tensor-core alignment: sizes that are multiples of the granularity run at full speed; "
        "in brackets, the median throughput of sizes that miss it, relative to full speed "
        "(`none`: no level falls by more than the threshold).",
        "",
    ]

    def cell(c: dict | None) -> str:
        if not c or c.get("missed_relative") is None:
            return "none"
        return f"**{c['granularity']}** ({c['missed_relative']:.2f})"

    rows = []
    for layout, by_dtype in full["cliffs"]["gemm"].items():
        for dtype, dims in by_dtype.items():
            rows.append(
                (
                    f"GEMM {dtype} {layout}",
                    cell(dims.get("M")),
                    cell(dims.get("N")),
                    cell(dims.get("K")),
                )
            )
    for dtype, kinds in full["cliffs"]["conv"].items():
        for kind in ("1x1", "3x3"):
            rows.append(
                (
                    f"conv {kind} {dtype}",
                    "-",
                    cell(kinds.get(f"{kind} cout")),
                    cell(kinds.get(f"{kind} cin")),
                )
            )
    out += _table(("sweep", "M", "N (conv: out channels)", "K (conv: in channels)"), rows)
    align = ", ".join(f"{k} {v}" for k, v in full["tc_align_elems"].items())
    out += [
        "",
        f"The profile's alignment per dtype (elements): {align}. Batch size: "
        f"{full['cliffs']['batch']['gemm_batch']['evidence']} (GEMM rows); "
        f"{full['cliffs']['batch']['conv_batch']['evidence']} (convolution batch). Wave "
        f"quantization: {full['wave_quantization']['evidence']}.",
        "",
        "The shipped profile, which `gpushape audit --gpu h200` applies by default, is the full "
        "run's profile with the families and attention rates measured later added "
        f"(`{full['probe']['memory_efficiency_command']}` and the commands recorded in the "
        "shipped profile's `probe` section).",
        "",
    ]
    return out


def _families() -> list[str]:
    shipped = json.loads(PROFILE.read_text())
    fam = shipped["memory_efficiency"]
    rows = [
        (
            name,
            f["workload"],
            f"{f['efficiency']:.2f}",
            _ms(f.get("measured_s")),
            _ms(f.get("family_roofline_s")),
        )
        for name, f in fam.items()
    ]
    stem = shipped["conv_small_cin"]
    conv = fam.get("nchw_conversion")
    out = [
        "## Eager kernels against the copy rate",
        "",
        "One bf16 training step per kind of kernel, its bytes counted by gpushape's own "
        "formulas, replayed from a CUDA graph; the fraction is the time those bytes take at "
        "the copy rate over the time measured. The cost model divides each op's memory time "
        "by its family's fraction (`src/gpushape/tracing/families.py`); the `fused_*` rows "
        "are gpushape's kernels, which price the fusion rules' fixes. From the shipped "
        f"profile; logs: {_link('probe-h200/memory-efficiency.log')}, "
        f"{_link('probe-h200/calibrate-batch-norm-act.log')}.",
        "",
        *_table(
            ("family", "workload", "fraction of copy", "measured ms", "at copy rate ms"),
            rows,
            right=3,
        ),
        "",
        f"A convolution on 3 input channels ({stem['workload']}) ran at "
        f"{stem['efficiency']:.3f} of the rate the GEMM model gives its shape "
        f"({_ms(stem['measured_s'])} ms against {_ms(stem['model_s'])}); the cost model "
        "prices convolutions with fewer input channels per group than the tensor-core "
        "alignment at that rate.",
    ]
    if conv:
        lost = conv["measured_s"] - conv["channels_last_s"]
        out += [
            "",
            f"`nchw_conversion`: {conv['workload']} took {_ms(conv['measured_s'])} ms in NCHW "
            f"against {_ms(conv['channels_last_s'])} in channels_last, {_ms(lost)} ms more, "
            f"where cuDNN's layout conversions ({conv['conversion_bytes'] / 1e9:.2f} GB) take "
            f"{_ms(conv['family_roofline_s'])} ms at the copy rate: the fraction is capped at "
            f"{conv['efficiency']:.2f}.",
        ]
    return [*out, ""]


def _attention() -> list[str]:
    shipped = json.loads(PROFILE.read_text())
    att = shipped["attention"]
    rows = []
    for a in att.values():
        fwd = next(v for k, v in a.items() if "/fwd/" in k)
        bwd = next(v for k, v in a.items() if "/bwd/" in k)
        rows.append(
            (
                a["workload"],
                f"{fwd:.2f}",
                f"{a['tflops_fwd']:.0f}",
                f"{bwd:.2f}",
                f"{a['tflops_bwd']:.0f}",
            )
        )
    out = [
        "## Fused attention against the GEMM model",
        "",
        "One `scaled_dot_product_attention` call, bf16, timed forward and forward+backward "
        "from a CUDA graph, against what the GEMM model gives its matmuls. The cost model "
        "multiplies an attention kernel's GEMM efficiency by the fraction measured for its "
        "backend, pass, dropout and causal flags at the nearest head size. From the shipped "
        f"profile; log: {_link('probe-h200/calibrate-attention.log')}. Causal TFLOP/s count "
        "only the unmasked half of the score matrix.",
        "",
        *_table(("kernel", "fwd fraction", "fwd TFLOP/s", "bwd fraction", "bwd TFLOP/s"), rows, 4),
    ]
    flash, eff = att.get("flash/dropout/d64"), att.get("efficient/dropout/d64")
    if flash and eff:
        out += [
            "",
            "A mask passed to SDPA sends it to the memory-efficient kernel: with dropout and "
            "head size 64 its forward took "
            f"{_ratio(eff['measured_fwd_s'], flash['measured_fwd_s'])}x as long as flash's.",
        ]
    return [*out, ""]


def _claims() -> list[str]:
    full = _load("probe-h200/h200-sxm.json")
    quick = {c["id"]: c for c in _load("probe-h200-quick/h200-sxm.json").get("guide_claims", [])}

    def numbers(c: dict) -> str:
        parts = []
        for k, v in (c.get("numbers") or {}).items():
            if isinstance(v, float):
                parts.append(f"{k} {v:.3g}")
            elif isinstance(v, (int, str, bool)):
                parts.append(f"{k} {v}")
        return "; ".join(parts)

    rows = []
    for c in full["guide_claims"]:
        gain = "-" if c.get("gain") is None else f"{c['gain']:+.2f}"
        q = quick.get(c["id"], {}).get("verdict", "-")
        rows.append((f"`{c['id']}`", c["says"], c["claimed"], numbers(c), gain, c["verdict"], q))
    return [
        "## The design guide's rules of thumb on this H200",
        "",
        "Each claim of the design guide (written for the A100) measured by `gpushape probe` "
        "(`src/gpushape/probe/guide_claims*.py`): both variants checked to compute the same "
        "result, then timed alternately. Gain: the measured speed-up of the guide's advice "
        "(+1.00 = twice as fast). Verdict: holds if the gain is at least half the claimed "
        "one; holds only partly if smaller but above 3%; does not hold at 3% or less (a claim "
        "without a number is taken as a 20% gain; a claim with its own rule states it in "
        f"the report). Full run: {_link('probe-h200/probe-report.md')}; the last column is "
        "the quick run's verdict. docs/design.md discusses them.",
        "",
        *_table(
            ("claim", "the guide says", "claimed", "measured", "gain", "verdict", "quick run"),
            rows,
        ),
        "",
    ]


CORRELATE_RUNS = (
    ("correlate-h200/correlate-flat-memory.json", "every op's bytes at the copy rate"),
    ("correlate-h200/correlate.json", "each family at its measured rate (the default)"),
    ("correlate-h200/correlate-nchw.json", "the default, with ResNet-50 also left in NCHW"),
    ("correlate-h200/correlate-one-pass-bn.json", "earlier in the day, before the family rates"),
)


def _by_type(result: dict) -> dict[str, tuple[float, float, int]]:
    """Module type -> (predicted kernel s, measured s, modules)."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in result["rows"]:
        t = out[r["type"]]
        t[0] += r["predicted_kernel_s"]
        t[1] += r["measured_s"]
        t[2] += 1
    return {k: tuple(v) for k, v in out.items()}


def _correlate() -> list[str]:
    rows = []
    for rel, label in CORRELATE_RUNS:
        data = _load(rel)
        for r in data["results"]:
            rows.append(
                (
                    label,
                    _link(rel, Path(rel).name),
                    r["model"],
                    r["batch"],
                    r["modules"],
                    f"{r['spearman_kernel_time']:.3f}",
                    _ms(r["predicted_total_kernel_s"], 1),
                    _ms(r["measured_total_s"], 1),
                    f"{r['ratio_kernel']:.2f}",
                )
            )
    out = [
        "## Cost model against the profiler",
        "",
        "`benchmarks/trace/correlate.py`: bf16 training steps on the H200, per-module CUDA "
        "time from torch.profiler (forward by module ranges, backward by autograd sequence "
        "numbers) against gpushape's predicted kernel time for the same modules. Spearman: "
        "rank correlation over modules; the last columns sum the step's kernels.",
        "",
        *_table(
            (
                "pricing",
                "file",
                "model",
                "batch",
                "modules",
                "Spearman",
                "predicted ms",
                "measured ms",
                "predicted / measured",
            ),
            rows,
            right=6,
        ),
        "",
        "By module type (predicted / measured, summed over the type's modules; containers "
        "such as Bottleneck include their children):",
        "",
    ]
    flat = {r["model"]: r for r in _load(CORRELATE_RUNS[0][0])["results"]}
    default = {r["model"]: r for r in _load(CORRELATE_RUNS[1][0])["results"]}
    nchw = {r["model"]: r for r in _load(CORRELATE_RUNS[2][0])["results"]}
    default.update({k: v for k, v in nchw.items() if k not in default})
    rows = []
    for model, result in default.items():
        types = _by_type(result)
        flat_types = _by_type(flat[model]) if model in flat else {}
        for name, (pred, meas, n) in sorted(types.items(), key=lambda kv: -kv[1][1]):
            f = flat_types.get(name)
            rows.append(
                (
                    model,
                    name,
                    n,
                    _ms(meas, 3),
                    _ratio(f[0], f[1]) if f else "-",
                    _ratio(pred, meas),
                )
            )
    out += _table(
        ("model", "module type", "modules", "measured ms", "at copy rate", "default"), rows, 4
    )
    stem = {r["model"]: next(x for x in r["rows"] if x["module"] == "conv1") for r in nchw.values()}
    bn1 = next(x for x in nchw["resnet50-nchw"]["rows"] if x["module"] == "bn1")
    out += [
        "",
        "ResNet-50's stem convolution `conv1` (3 input channels): predicted "
        + ", ".join(
            f"{_ms(s['predicted_kernel_s'])} ms against {_ms(s['measured_s'])} measured ({m})"
            for m, s in stem.items()
        )
        + f". In NCHW, the stem's `bn1` is predicted at {_ms(bn1['predicted_kernel_s'])} ms "
        f"against {_ms(bn1['measured_s'])} measured: the NCHW BatchNorm rate was measured on "
        "256 channels at 56x56, not 64 at 112x112.",
        "",
    ]
    return out


def _validate() -> list[str]:
    data = _load("audit-validate-h200/validate_savings.json")
    early = {
        r["rule"]: r
        for r in _load("audit-validate-h200/validate_savings-run1-eager-only.json")["results"]
    }
    rows = []
    for r in data["results"]:
        graph = r.get("graph_saving_s")
        first = early.get(r["case"]) if r["case"] == r["rule"] else None
        rows.append(
            (
                r["case"],
                _ms(r["predicted_saving_s"]),
                _ms(graph),
                _ratio(r["predicted_saving_s"], graph),
                _ms(r["measured_saving_s"]),
                _ms(first["measured_saving_s"]) if first else "-",
            )
        )
    ratios = [
        r["predicted_saving_s"] / r["graph_saving_s"]
        for r in data["results"]
        if r.get("graph_saving_s")
    ]
    out = [
        "## The audit's savings against measurement",
        "",
        "`benchmarks/audit/validate_savings.py` "
        f"({_link('audit-validate-h200/validate_savings.json', 'validate_savings.json')}, "
        f"{data['calibration']}): each rule's textbook case, as is and fixed, one bf16 "
        "training step each, alternated. The saving the audit predicts for the H200 against "
        "the one measured from CUDA-graph replays (GPU time alone, what the cost model "
        "prices) and eagerly timed (host included). The last column is an earlier, "
        "eager-only run "
        f"({_link('audit-validate-h200/validate_savings-run1-eager-only.json', 'run 1')}).",
        "",
        *_table(
            (
                "case",
                "predicted ms",
                "measured ms (graph)",
                "predicted / graph",
                "measured ms (eager)",
                "run 1 eager ms",
            ),
            rows,
            right=5,
        ),
        "",
        f"Predicted over graph-measured savings range from {min(ratios):.2f} to "
        f"{max(ratios):.2f}. A single fused op's step is host-bound when timed eagerly, so "
        "the fusion rules' savings show only where the GPU is the bottleneck (a whole "
        "model's step, or a CUDA graph); a negative eager saving means the fixed step ran "
        "slower on the host's clock.",
        "",
    ]
    diag = _load("audit-validate-h200/diagnose_nchw.json")
    rows = [
        (
            r["workload"],
            f"{r['nchw_ms']:.2f}",
            f"{r['channels_last_ms']:.2f}",
            f"{r['difference_ms']:.2f}",
            f"{r['rule_bytes'] / 1e9:.2f}",
            f"{r['rule_at_copy_rate_ms']:.2f}",
        )
        for r in diag["rows"]
    ]
    totals = diag["resnet50_kernel_totals_us"]
    kernels = [
        (
            f"`{_kernel_name(k['kernel'])}`",
            f"{k['nchw_us'] / 1e3:.2f}",
            f"{k['channels_last_us'] / 1e3:.2f}",
        )
        for k in diag["resnet50_top_kernels"][:8]
    ]
    out += [
        f"Where NCHW loses (`benchmarks/audit/diagnose_nchw.py`, "
        f"{_link('audit-validate-h200/diagnose_nchw.json', 'diagnose_nchw.json')}): "
        "ResNet-50 and its parts in both layouts, training steps replayed from CUDA graphs; "
        "conversion bytes as `tracing/layout.py` counts them.",
        "",
        *_table(
            (
                "workload",
                "NCHW ms",
                "channels_last ms",
                "difference ms",
                "conversion GB",
                "at copy rate ms",
            ),
            rows,
            right=5,
        ),
        "",
        f"ResNet-50's kernels by name (torch.profiler, one step): {totals['nchw'] / 1e3:.1f} ms "
        f"in NCHW against {totals['channels_last'] / 1e3:.1f} in channels_last; the kernels "
        "that differ most:",
        "",
        *_table(("kernel", "NCHW ms", "channels_last ms"), kernels, right=2),
        "",
    ]
    return out


def _kernel_name(name: str) -> str:
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


def _rows_by(rows: list[dict]) -> dict[tuple, dict]:
    return {
        (r.get("op", ""), _shape(r["shape"]), r["direction"], r["variant"]): r
        for r in rows
        if "median_ms" in r
    }


CRITERION = re.compile(
    r"^(?:(?P<op>\w+) )?(?P<dir>fwd\+bwd graph|fwd\+bwd|fwd) vs (?P<base>[\w.]+) @(?P<shape>\S+)$"
)


def _needed(data: dict) -> list[str]:
    """For each missed speed-up target: the gpushape time it asks for, as a rate against the
    copy bandwidth measured in the same run."""
    by = _rows_by(data["results"])
    copy = data["copy_bandwidth_gbps"]
    lines = []
    for c in data["criteria"]:
        m = CRITERION.match(c["criterion"])
        if not m or c["verdict"] == "PASS":
            continue
        key = (m["op"] or "", m["shape"], m["dir"])
        base = by.get((*key, m["base"].replace("torch.", "")))
        ours = by.get((*key, "gpushape"))
        if not base or not ours or not ours.get("min_bytes"):
            continue
        need_s = base["median_ms"] / 1e3 / c["target"]
        need_gbps = ours["min_bytes"] / need_s / 1e9
        lines.append(
            f"- {c['criterion']}: {c['target']:g}x asks for {need_s * 1e3:.3f} ms, "
            f"{need_gbps:,.0f} GB/s over the minimum bytes, {need_gbps / copy:.2f} of the "
            f"copy rate; gpushape ran at {ours['gbps'] / copy:.2f} of it ({c['value']:.2f}x)."
        )
    return lines


def _method(text: str) -> str:
    """A result file's method note, without its pointer to measurements kept elsewhere."""
    return re.sub(r",? as the anchors\b", "", text)


def _kernel_bench(rel: str, title: str) -> list[str]:
    data = _load(rel)
    out = [
        f"### {title}",
        "",
        f"{environment_line(data['environment'])}; {_link(rel, Path(rel).name)}. "
        f"Method: {_method(data['timing'])}. Copy bandwidth in the same run: "
        f"{data['copy_bandwidth_gbps']:,.0f} GB/s.",
        "",
        *timing_table(data["results"], Path(rel).stem.removeprefix("bench_")),
        "",
        *criteria_table(data["criteria"]),
        "",
    ]
    needed = _needed(data)
    if needed:
        out += ["What the missed targets would take:", "", *needed, ""]
    return out


def speedups() -> dict[str, tuple[float, str, str]]:
    """Each kernel's headline speed-up on the H200: (value, what, result file); the README's
    kernel table quotes these (tests/test_summarize.py checks it does)."""
    norms = {c["criterion"]: c["value"] for c in _load("kernels-h200/bench_norms.json")["criteria"]}
    bn = {
        c["criterion"]: c["value"]
        for c in _load("kernels-h200/bench_batch_norm_act.json")["criteria"]
    }
    att = _load("kernels-h200/bench_attention.json")
    crit = {c["criterion"]: c["value"] for c in att["criteria"]}
    kv = {(r["length"], r["variant"]): r["median_us"] for r in att["results"]["kv_append"]}
    longest = max(length for length, _ in kv)
    n, b, a = (
        "kernels-h200/bench_norms.json",
        "kernels-h200/bench_batch_norm_act.json",
        "kernels-h200/bench_attention.json",
    )
    graph = "fwd+bwd graph vs eager @"
    return {
        "layer_norm_gelu": (norms[f"layer_norm_gelu {graph}32768x4096"], "fwd+bwd, 32768x4096", n),
        "add_layer_norm": (norms[f"add_layer_norm {graph}32768x4096"], "fwd+bwd, 32768x4096", n),
        "rms_norm": (norms[f"rms_norm {graph}32768x4096"], "fwd+bwd, 32768x4096", n),
        "batch_norm_act": (bn[f"{graph}256x256x56x56"], "fwd+bwd, 256x256x56x56", b),
        "softmax_dropout": (
            crit["softmax_dropout fwd+bwd vs eager @262144x1024"],
            "fwd+bwd, 262144x1024",
            a,
        ),
        "FusedQKV": (
            crit[
                "FusedQKV fwd+bwd GPU time (CUDA graph, SDPA's grad layout) vs 3 Linear @BERT-base"
            ],
            "fwd+bwd, BERT-base",
            a,
        ),
        "KVCache": (
            kv[(longest, "torch.cat")] / kv[(longest, "append")],
            f"one append to a {longest}-token cache",
            a,
        ),
    }


def _fused_qkv() -> list[str]:
    att = _load("kernels-h200/bench_attention.json")
    table: dict[tuple, dict] = defaultdict(dict)
    for r in att["results"]["fused_qkv"]:
        table[(r["case"], r["direction"])][r["variant"]] = r["median_ms"]
    rows = [
        (
            case,
            d,
            f"{t['3 Linear']:.3f}",
            f"{t['gpushape']:.3f}",
            _ratio(t["3 Linear"], t["gpushape"]),
        )
        for (case, d), t in table.items()
    ]
    out = [
        "#### FusedQKV",
        "",
        "The projections' forward+backward with the gradients of q, k, v laid out as "
        "`scaled_dot_product_attention`'s backward gives them ((B, T, heads, D) memory seen "
        "as (B, heads, T, D)), unless the row says otherwise; `with SDPA` includes flash "
        "attention.",
        "",
        *_table(("shape", "pass", "3 Linear ms", "FusedQKV ms", "speed-up"), rows, right=3),
        "",
    ]
    rel = "kernels-h200/probe_qkv_grads_rerun.json"
    grads = _load(rel)
    rows = []
    for case, s in grads["shapes"].items():
        for what, t in s["times"].items():
            rows.append(
                (
                    case,
                    what,
                    *(f"{t[v]:.3f}" for v in t),
                    _ratio(t["3 Linear"], t["FusedQKV assembly free (ceiling)"]),
                )
            )
    variants = list(next(iter(next(iter(grads["shapes"].values()))["times"].values())))
    out += [
        f"Where FusedQKV's time goes (`benchmarks/kernels/probe_qkv_grads.py`, "
        f"{_link(rel, Path(rel).name)}, CUDA graphs, variants alternated): `plain views` "
        "leaves the gradient to autograd's `cat`, `no-assembly` reads the gradients where they "
        "lie, and `assembly free` runs FusedQKV's GEMMs with the gradient assembly taken as "
        "free: the ceiling of merging the projections at that shape.",
        "",
        *_table(
            ("shape", "what", *(f"{v} ms" for v in variants), "ceiling speed-up"),
            rows,
            right=len(variants) + 1,
        ),
        "",
    ]
    rel = "kernels-h200/probe_qkv_gemms.json"
    gemms = _load(rel)
    rows = []
    for variant, kernels in gemms["kernels"].items():
        by_name: dict[str, list[float]] = defaultdict(list)
        for name, us in kernels:
            by_name[_kernel_name(name)].append(us)
        for name, times in by_name.items():
            low, high = f"{min(times):.1f}", f"{max(times):.1f}"
            each = low if low == high else f"{low}-{high}"
            rows.append((variant, f"`{name}`", len(times), each, f"{sum(times):.1f}"))
    out += [
        f"LLaMA-7B's projection kernels (`benchmarks/kernels/probe_qkv_gemms.py`, "
        f"{_link(rel, Path(rel).name)}, torch.profiler, one fwd+bwd):",
        "",
        *_table(("step", "kernel", "calls", "us each", "us in all"), rows, right=3),
        "",
    ]
    kv: dict[int, dict] = defaultdict(dict)
    for r in att["results"]["kv_append"]:
        kv[r["length"]][r["variant"]] = r["median_us"]
    kv_variants = list(next(iter(kv.values())))
    out += [
        "#### KVCache",
        "",
        "One decode step's append to a cache of the given length, us (`append_static graph`: "
        "the CUDA-graph-safe variant replayed from a graph):",
        "",
        *_table(
            ("cache length", *kv_variants),
            ((n, *(f"{v[k]:.1f}" for k in kv_variants)) for n, v in kv.items()),
            right=len(kv_variants),
        ),
        "",
    ]
    return out


def _kernels() -> list[str]:
    sp = speedups()
    out = [
        "## Fused kernels",
        "",
        "bf16 unless stated; fwd+bwd = forward plus `torch.autograd.grad` of every input. Two "
        "timings of fwd+bwd: queued eager calls (`fwd+bwd`), which is what an eager training "
        "loop pays and includes the host's launch and autograd cost wherever that exceeds "
        "the GPU work, and the same step replayed from a CUDA graph (`fwd+bwd graph`): GPU "
        "time alone. Headline speed-ups (the README's kernel table):",
        "",
        *_table(
            ("kernel", "speed-up", "measured on", "file"),
            ((k, f"{v:.2f}x", what, _link(f)) for k, (v, what, f) in sp.items()),
            right=0,
        ),
        "",
        *_kernel_bench("kernels-h200/bench_norms.json", "Row norms (`bench_norms.py`)"),
        *_kernel_bench(
            "kernels-h200/bench_batch_norm_act.json",
            "BatchNorm + residual + ReLU, training, channels_last (`bench_batch_norm_act.py`)",
        ),
    ]
    att = _load("kernels-h200/bench_attention.json")
    out += [
        "### Attention path (`bench_attention.py`)",
        "",
        f"{environment_line(att['environment'])}; "
        f"{_link('kernels-h200/bench_attention.json', 'bench_attention.json')}. Method: "
        f"{att['timing']}. Copy bandwidth in the same run: {att['copy_bandwidth_gbps']:,.0f} "
        "GB/s.",
        "",
        *criteria_table(att["criteria"]),
        "",
        "#### SoftmaxDropout",
        "",
        *timing_table(att["results"]["softmax_dropout"], "softmax_dropout"),
        "",
    ]
    held = [r for r in att["results"]["softmax_dropout"] if r["direction"] == "memory"]
    if held:
        out += [
            "Memory held for backward, MB: "
            + "; ".join(f"{r['case']} {r['variant']} {r['held_mb']:,.0f}" for r in held)
            + ".",
            "",
        ]
    out += _fused_qkv()
    out += _host_costs()
    return out


def _host_costs() -> list[str]:
    rel = "kernels-h200/host_costs.json"
    host = _load(rel)
    rows = [(k, f"{v:.1f}") for k, v in host["us_per_call"].items()]
    prof = _load("kernels-h200/profile_batch_norm_act.json")
    prows = [
        (
            _shape(r["shape"]),
            r["variant"],
            f"{r['kernel_us']:.0f}",
            f"{r['wall_us']:.0f}",
        )
        for r in prof["results"]
    ]
    grouped = _load("kernels-h200/tune_batch_norm_grouped.json")["results"]["rows"]
    speed = [r["fwd+bwd speedup"] for r in grouped if r.get("fwd+bwd speedup")]
    diag = _load("kernels-h200/diagnose_batch_norm_act.json")
    fails = sum(r["fails"] for r in diag["results"])
    runs = sum(r["repeats"] for r in diag["results"])
    configs = sorted({r["config"] for r in diag["results"]})
    shapes = {tuple(r["shape"]) for r in diag["results"]}
    return [
        "### Host time",
        "",
        "In eager mode a small shape is bound by the host: the Python autograd.Function, the "
        "launches and autograd's engine. `benchmarks/kernels/host_costs.py` "
        f"({_link(rel, Path(rel).name)}, tiny shapes so the host alone counts, "
        f"{host['calls']} calls each), us per call:",
        "",
        *_table(("what", "us"), rows, right=1),
        "",
        "BatchNormAct2d's kernels against its wall time a step "
        f"(`benchmarks/kernels/profile_batch_norm_act.py`, "
        f"{_link('kernels-h200/profile_batch_norm_act.json', 'profile_batch_norm_act.json')}; "
        f"{prof['note']}):",
        "",
        *_table(("shape", "variant", "kernel us", "wall us"), prows, right=2),
        "",
        "A grid-synchronised persistent BatchNorm kernel, which keeps a channel group's rows "
        "in L2 between its two passes, was correct but ran at "
        f"{min(speed):.2f}x-{max(speed):.2f}x the two-kernel path's fwd+bwd speed over "
        f"{len(speed)} configurations and shapes "
        f"({_link('kernels-h200/tune_batch_norm_grouped.json', 'tune_batch_norm_grouped.json')}); "
        "it was not kept. The BatchNorm kernels checked stage by stage against float64 "
        "(`diagnose_batch_norm_act.py`, "
        f"{_link('kernels-h200/diagnose_batch_norm_act.json', 'diagnose_batch_norm_act.json')}): "
        f"{fails} failures in {runs} runs over {len(configs)} launch configurations and "
        f"{len(shapes)} shapes.",
        "",
    ]


def _log_lines(rel: str) -> list[str]:
    """A log's own lines, without Python warnings and the source lines they quote."""
    keep = []
    for line in (RESULTS / rel).read_text().splitlines():
        if "Warning" in line or line.startswith("  return ") or line.startswith("  _warn"):
            continue
        keep.append(line.rstrip())
    return keep


def _examples() -> list[str]:
    return [
        "## Examples",
        "",
        "`examples/audit_channels_last.py --measure` audits ResNet-50 (batch 64, bf16, "
        "training) in NCHW and in channels_last for the H200, then times both steps from "
        f"CUDA graphs ({_link('examples-h200/audit_channels_last.log')}):",
        "",
        "```",
        *_log_lines("examples-h200/audit_channels_last.log"),
        "```",
        "",
        "`examples/fused_block.py` puts `AddLayerNorm` into a pre-norm transformer block and "
        "times a training step eagerly and from a CUDA graph "
        f"({_link('examples-h200/fused_block.log')}); in this GEMM-bound block the fused "
        "norms make no difference beyond noise:",
        "",
        "```",
        *_log_lines("examples-h200/fused_block.log"),
        "```",
        "",
        "`examples/audit_attention.py` runs on a CPU (no result file: run it to see the cost "
        "model's predictions).",
        "",
    ]


def _tests() -> list[str]:
    logs = [
        ("kernels-h200/pytest-gpu.log", "`pytest -m gpu`, the whole GPU lane"),
        ("kernels-h200/pytest-gpu-attention.log", "the attention kernels' GPU tests"),
        ("kernels-h200/pytest-gpu-misc.log", "bench, hardware, tracing, auditing, cli GPU tests"),
        ("kernels-h200/pytest-gpu-batch-norm-grouped.log", "the persistent BatchNorm experiment"),
        ("make-test-h200.log", "`make test` (CPU suite) on the GPU machine"),
    ]
    return [
        "## Test runs on the H200",
        "",
        *_table(("run", "log", "result"), ((w, _link(r), _log_summary(r)) for r, w in logs)),
        "",
    ]


def _cpu() -> list[str]:
    rel = "trace-cpu-2026-11-30.json"
    data = _load(rel)
    env = data["environment"]
    rows = []
    for name, r in data["results"].items():
        m = r["median"]
        if "trace_first_s" in m:
            rows.append(
                (
                    name,
                    f"{m['import_s']:.2f}",
                    f"{m['build_s']:.2f}",
                    f"{m['trace_first_s']:.2f}",
                    f"{m['trace_warm_s']:.2f}",
                    f"{m['cost_s']:.3f}",
                    m["ops"],
                    f"{m['peak_rss_mb']:.0f}",
                )
            )
    demo = data["results"].get("audit-demo", {}).get("median")
    out = [
        "## Tracing speed on a CPU",
        "",
        f"`benchmarks/trace/bench_trace.py` ({_link(rel, rel)}; torch {env['torch']}, "
        f"Python {env['python']}, no GPU; {data['method']}): seconds.",
        "",
        *_table(
            ("case", "import", "build", "first trace", "warm trace", "cost", "ops", "peak RSS MB"),
            rows,
            right=7,
        ),
    ]
    if demo:
        out += ["", f"`gpushape {demo['command']}` end to end: {demo['wall_s']:.1f} s wall."]
    return [*out, ""]


def docs_page() -> str:
    parts = [
        _header(),
        _probe(),
        _families(),
        _attention(),
        _claims(),
        _correlate(),
        _validate(),
        _kernels(),
        _examples(),
        _tests(),
        _cpu(),
    ]
    text = "\n".join(line for part in parts for line in part)
    text += "\n" + "\n".join(_other_files(text))
    return text.rstrip("\n") + "\n"


def _other_files(text: str) -> list[str]:
    """The result files the sections above do not cite, each with where it came from."""
    cited = set(re.findall(r"\(\.\./benchmarks/results/([^)]+)\)", text))
    rows = []
    for path in sorted(RESULTS.rglob("*")):
        rel = path.relative_to(RESULTS).as_posix()
        if not path.is_file() or path.suffix == ".png" or rel in cited:
            continue
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            env = data.get("environment") or data.get("env") or data.get("probe") or {}
            what = f"`{env.get('command') or data.get('command', '')}`"
        else:
            first = path.read_text().splitlines()[:1]
            if first and first[0].startswith("#"):
                what = first[0].lstrip("# ")
            elif path.with_suffix(".json").exists():
                what = f"console output of the run that wrote `{path.stem}.json`"
            else:
                what = "console output"
        rows.append((_link(rel), what))
    if not rows:
        return []
    return [
        "## Other result files",
        "",
        "Kept for the record (tuning sweeps whose winners are the kernels' launch tables, "
        "re-runs):",
        "",
        *_table(("file", "what"), rows),
        "",
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["docs"]:
        sys.stdout.write(docs_page())
        return 0
    for name in argv:
        print(summarize(Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
