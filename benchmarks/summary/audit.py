"""The audit against measurement: the cost model against the profiler (correlate-h200/) and
the audit's predicted savings against measured ones (audit-validate-h200/)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .common import kernel_name, link, load, md_table, ms, ratio

CORRELATE_RUNS = (
    ("correlate-h200/correlate-flat-memory.json", "every op's bytes at the copy rate"),
    ("correlate-h200/correlate.json", "each family at its measured rate (the default)"),
    ("correlate-h200/correlate-nchw.json", "the default, with ResNet-50 also left in NCHW"),
    ("correlate-h200/correlate-one-pass-bn.json", "earlier in the day, before the family rates"),
    (
        "correlate-h200/correlate-lib.json",
        "library models (timm NCHW, Hugging Face), families priced by size",
    ),
)


def by_type(result: dict) -> dict[str, tuple[float, float, int]]:
    """Module type -> (predicted kernel s, measured s, modules)."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in result["rows"]:
        t = out[r["type"]]
        t[0] += r["predicted_kernel_s"]
        t[1] += r["measured_s"]
        t[2] += 1
    return {k: tuple(v) for k, v in out.items()}


def correlate() -> list[str]:
    rows = []
    for rel, label in CORRELATE_RUNS:
        data = load(rel)
        for r in data["results"]:
            rows.append(
                (
                    label,
                    link(rel, Path(rel).name),
                    r["model"].split("?")[0],
                    r["batch"] or "default",
                    r["modules"],
                    f"{r['spearman_kernel_time']:.3f}",
                    ms(r["predicted_total_kernel_s"], 1),
                    ms(r["measured_total_s"], 1),
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
        *md_table(
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
    flat = {r["model"]: r for r in load(CORRELATE_RUNS[0][0])["results"]}
    default = {r["model"]: r for r in load(CORRELATE_RUNS[1][0])["results"]}
    nchw = {r["model"]: r for r in load(CORRELATE_RUNS[2][0])["results"]}
    default.update({k: v for k, v in nchw.items() if k not in default})
    rows = []
    for model, result in default.items():
        types = by_type(result)
        flat_types = by_type(flat[model]) if model in flat else {}
        for name, (pred, meas, n) in sorted(types.items(), key=lambda kv: -kv[1][1]):
            f = flat_types.get(name)
            rows.append(
                (
                    model,
                    name,
                    n,
                    ms(meas, 3),
                    ratio(f[0], f[1]) if f else "-",
                    ratio(pred, meas),
                )
            )
    out += md_table(
        ("model", "module type", "modules", "measured ms", "at copy rate", "default"), rows, 4
    )
    stem = {r["model"]: next(x for x in r["rows"] if x["module"] == "conv1") for r in nchw.values()}
    bn1 = next(x for x in nchw["resnet50-nchw"]["rows"] if x["module"] == "bn1")
    out += [
        "",
        "ResNet-50's stem convolution `conv1` (3 input channels): predicted "
        + ", ".join(
            f"{ms(s['predicted_kernel_s'])} ms against {ms(s['measured_s'])} measured ({m})"
            for m, s in stem.items()
        )
        + f". In NCHW, the stem's `bn1` is predicted at {ms(bn1['predicted_kernel_s'])} ms "
        f"against {ms(bn1['measured_s'])} measured: the NCHW BatchNorm rate was measured on "
        "256 channels at 56x56, not 64 at 112x112.",
        "",
    ]
    return out


def validate() -> list[str]:
    data = load("audit-validate-h200/validate_savings.json")
    early = {
        r["rule"]: r
        for r in load("audit-validate-h200/validate_savings-run1-eager-only.json")["results"]
    }
    rows = []
    for r in data["results"]:
        graph = r.get("graph_saving_s")
        first = early.get(r["case"]) if r["case"] == r["rule"] else None
        rows.append(
            (
                r["case"],
                ms(r["predicted_saving_s"]),
                ms(graph),
                ratio(r["predicted_saving_s"], graph),
                ms(r["measured_saving_s"]),
                ms(first["measured_saving_s"]) if first else "-",
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
        f"({link('audit-validate-h200/validate_savings.json', 'validate_savings.json')}, "
        f"{data['calibration']}): each rule's textbook case, as is and fixed, one bf16 "
        "training step each, alternated. The saving the audit predicts for the H200 against "
        "the one measured from CUDA-graph replays (GPU time alone, what the cost model "
        "prices) and eagerly timed (host included). The last column is an earlier, "
        "eager-only run "
        f"({link('audit-validate-h200/validate_savings-run1-eager-only.json', 'run 1')}).",
        "",
        *md_table(
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
    diag = load("audit-validate-h200/diagnose_nchw.json")
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
            f"`{kernel_name(k['kernel'])}`",
            f"{k['nchw_us'] / 1e3:.2f}",
            f"{k['channels_last_us'] / 1e3:.2f}",
        )
        for k in diag["resnet50_top_kernels"][:8]
    ]
    out += [
        f"Where NCHW loses (`benchmarks/audit/diagnose_nchw.py`, "
        f"{link('audit-validate-h200/diagnose_nchw.json', 'diagnose_nchw.json')}): "
        "ResNet-50 and its parts in both layouts, training steps replayed from CUDA graphs; "
        "conversion bytes as `tracing/layout.py` counts them.",
        "",
        *md_table(
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
        *md_table(("kernel", "NCHW ms", "channels_last ms"), kernels, right=2),
        "",
    ]
    return out
