"""The examples' logs, the test runs on the H200 and tracing speed on a CPU."""

from __future__ import annotations

from .common import link, load, log_lines, log_summary, md_table


def examples() -> list[str]:
    return [
        "## Examples",
        "",
        "`examples/audit_channels_last.py --measure` audits ResNet-50 (batch 64, bf16, "
        "training) in NCHW and in channels_last for the H200, then times both steps from "
        f"CUDA graphs ({link('examples-h200/audit_channels_last.log')}):",
        "",
        "```",
        *log_lines("examples-h200/audit_channels_last.log"),
        "```",
        "",
        "`examples/fused_block.py` puts `AddLayerNorm` into a pre-norm transformer block and "
        "times a training step eagerly and from a CUDA graph "
        f"({link('examples-h200/fused_block.log')}); in this GEMM-bound block the fused "
        "norms make no difference beyond noise:",
        "",
        "```",
        *log_lines("examples-h200/fused_block.log"),
        "```",
        "",
        "`examples/audit_attention.py` runs on a CPU (no result file: run it to see the cost "
        "model's predictions).",
        "",
    ]


def gpu_test_runs() -> list[str]:
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
        *md_table(("run", "log", "result"), ((w, link(r), log_summary(r)) for r, w in logs)),
        "",
    ]


def cpu_tracing() -> list[str]:
    rel = "trace-cpu-2026-11-30.json"
    data = load(rel)
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
        f"`benchmarks/trace/bench_trace.py` ({link(rel, rel)}; torch {env['torch']}, "
        f"Python {env['python']}, no GPU; {data['method']}): seconds.",
        "",
        *md_table(
            ("case", "import", "build", "first trace", "warm trace", "cost", "ops", "peak RSS MB"),
            rows,
            right=7,
        ),
    ]
    if demo:
        out += ["", f"`gpushape {demo['command']}` end to end: {demo['wall_s']:.1f} s wall."]
    return [*out, ""]
