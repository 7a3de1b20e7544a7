"""The probe's sections: ceilings and cliffs, eager kernels' families, fused attention's rates
and the design guide's rules of thumb (probe-h200/, probe-h200-quick/ and the shipped profile).
"""

from __future__ import annotations

import json

from .common import PROFILE, link, load, md_table, ms, ratio

NOISE = "within noise"  # the probe's verdict when single rounds straddle a line


def ceilings() -> list[str]:
    from gpushape.hardware import get_gpu

    full = load("probe-h200/h200-sxm.json")
    quick = load("probe-h200-quick/h200-sxm.json")
    shipped = json.loads(PROFILE.read_text())
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
            ratio(fc["copy_bytes_per_s"], spec.memory_bandwidth_bytes_per_s),
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
                ratio(fc["gemm_flops"][dtype], peak),
            )
        )
    cuda32 = spec.peak_flops("fp32", tensor_cores=False)
    rows.append(
        (
            "fp32 GEMM on CUDA cores (TF32 off), TFLOP/s",
            tflops(fc, "fp32", "gemm_flops_cuda_cores"),
            tflops(qc, "fp32", "gemm_flops_cuda_cores"),
            f"{cuda32 / 1e12:,.1f}",
            ratio(fc["gemm_flops_cuda_cores"]["fp32"], cuda32),
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
        f"`gpushape probe` on the H200: the full run ({link('probe-h200/probe-report.md')}, "
        f"profile {link('probe-h200/h200-sxm.json', 'h200-sxm.json')}, plots beside it; "
        f"{full['measured_at']}) and the quick run "
        f"({link('probe-h200-quick/probe-report.md')}; {quick['measured_at']}). The "
        "datasheet column is gpushape's catalog entry.",
        "",
        *md_table(
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
    out += md_table(("sweep", "M", "N (conv: out channels)", "K (conv: in channels)"), rows)
    align = ", ".join(f"{k} {v}" for k, v in full["tc_align_elems"].items())
    out += [
        "",
        f"The profile's alignment per dtype (elements): {align}. Batch size: "
        f"{full['cliffs']['batch']['gemm_batch']['evidence']} (GEMM rows); "
        f"{full['cliffs']['batch']['conv_batch']['evidence']} (convolution batch). Wave "
        f"quantization: {full['wave_quantization']['evidence']}.",
        "",
        "The shipped profile, which `gpushape audit --gpu h200` applies by default, is the "
        f"profile of the full probe run {shipped['measured_at']}, with the families and "
        "attention rates measured later added "
        f"(`{shipped['probe']['memory_efficiency_command']}` and the commands recorded in the "
        "shipped profile's `probe` section).",
        "",
    ]
    return out


def families() -> list[str]:
    shipped = json.loads(PROFILE.read_text())
    fam = shipped["memory_efficiency"]
    rows = [
        (
            name,
            f["workload"],
            f"{f['efficiency']:.2f}",
            ms(f.get("measured_s")),
            ms(f.get("family_roofline_s")),
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
        f"profile; logs: {link('probe-h200/memory-efficiency.log')}, "
        f"{link('probe-h200/calibrate-batch-norm-act.log')}.",
        "",
        *md_table(
            ("family", "workload", "fraction of copy", "measured ms", "at copy rate ms"),
            rows,
            right=3,
        ),
        "",
        f"A convolution on 3 input channels ({stem['workload']}) ran at "
        f"{stem['efficiency']:.3f} of the rate the GEMM model gives its shape "
        f"({ms(stem['measured_s'])} ms against {ms(stem['model_s'])}); the cost model "
        "prices convolutions with fewer input channels per group than the tensor-core "
        "alignment at that rate.",
    ]
    if conv:
        lost = conv["measured_s"] - conv["channels_last_s"]
        out += [
            "",
            f"`nchw_conversion`: {conv['workload']} took {ms(conv['measured_s'])} ms in NCHW "
            f"against {ms(conv['channels_last_s'])} in channels_last, {ms(lost)} ms more, "
            f"where cuDNN's layout conversions ({conv['conversion_bytes'] / 1e9:.2f} GB) take "
            f"{ms(conv['family_roofline_s'])} ms at the copy rate: the fraction is capped at "
            f"{conv['efficiency']:.2f}.",
        ]
    return [*out, ""]


def attention() -> list[str]:
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
                f"{a['tflops_fwd']:.0f}" if "tflops_fwd" in a else "-",
                f"{bwd:.2f}",
                f"{a['tflops_bwd']:.0f}" if "tflops_bwd" in a else "-",
            )
        )
    out = [
        "## Fused attention against the GEMM model",
        "",
        "One `scaled_dot_product_attention` call, bf16, timed forward and forward+backward "
        "from a CUDA graph, against what the GEMM model gives its matmuls. The cost model "
        "multiplies an attention kernel's GEMM efficiency by the fraction measured for its "
        "backend, pass, dropout and causal flags at the nearest head size. From the shipped "
        f"profile; log: {link('probe-h200/calibrate-attention.log')}. Causal TFLOP/s count "
        "only the unmasked half of the score matrix.",
        "",
        *md_table(
            ("kernel", "fwd fraction", "fwd TFLOP/s", "bwd fraction", "bwd TFLOP/s"), rows, 4
        ),
    ]
    flash, eff = att.get("flash/dropout/d64"), att.get("efficient/dropout/d64")
    if flash and eff:
        out += [
            "",
            "A mask passed to SDPA sends it to the memory-efficient kernel: with dropout and "
            "head size 64 its forward took "
            f"{ratio(eff['measured_fwd_s'], flash['measured_fwd_s'])}x as long as flash's.",
        ]
    return [*out, ""]


def claims() -> list[str]:
    full = load("probe-h200/h200-sxm.json")
    quick = {c["id"]: c for c in load("probe-h200-quick/h200-sxm.json").get("guide_claims", [])}

    def numbers(c: dict) -> str:
        parts = []
        for k, v in (c.get("numbers") or {}).items():
            if isinstance(v, float):
                parts.append(f"{k} {v:.3g}")
            elif isinstance(v, (int, str, bool)):
                parts.append(f"{k} {v}")
        return "; ".join(parts)

    rows, same, noise, differ = [], 0, [], []
    for c in full["guide_claims"]:
        gain = "-" if c.get("gain") is None else f"{c['gain']:+.2f}"
        q = quick.get(c["id"], {})
        verdicts = (c["verdict"], q.get("verdict"))
        if verdicts[0] == verdicts[1]:
            same += 1
        elif NOISE in verdicts:
            noise.append(f"`{c['id']}`")
        elif q:
            differ.append(f"`{c['id']}` ({verdicts[0]} against {verdicts[1]})")
        q_gain = "-" if q.get("gain") is None else f"{q['gain']:+.2f}"
        row = (f"`{c['id']}`", c["says"], c["claimed"], numbers(c), gain, c["verdict"])
        rows.append((*row, q_gain, q.get("verdict", "-")))
    return [
        "## The design guide's rules of thumb on this H200",
        "",
        "Each claim of the design guide (written for the A100) measured by `gpushape probe` "
        "(`src/gpushape/probe/guide_claims*.py`): both variants checked to compute the same "
        "result, then timed alternately. Gain: the measured speed-up of the guide's advice "
        "(+1.00 = twice as fast). Verdict: holds if the gain is at least half the claimed "
        "one; holds only partly if smaller but above 3%; does not hold at 3% or less (a claim "
        "without a number is taken as a 20% gain; a claim with its own rule states it in "
        "the report); within noise when the gains of single rounds (`gain_spread`) lie on "
        f"both sides of one of those lines. Full run: {link('probe-h200/probe-report.md')}; "
        "the last two columns are the quick run's. docs/design.md discusses them.",
        "",
        *md_table(
            (
                "claim",
                "the guide says",
                "claimed",
                "measured",
                "gain",
                "verdict",
                "quick gain",
                "quick verdict",
            ),
            rows,
        ),
        "",
        f"The two runs agree on {same} of {len(rows)} claims; "
        + (f"one of them says within noise for {', '.join(noise)}; " if noise else "")
        + (
            f"they disagree on {', '.join(differ)}."
            if differ
            else "no verdict of one run contradicts the other's."
        ),
        "",
    ]
