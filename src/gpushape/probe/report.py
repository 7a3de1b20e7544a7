"""The probe's Markdown report: ceilings against the datasheet, cliffs, and the guide's claims.

`write_report(profile, out_dir)` needs only the profile dict (or file), so a committed profile
can be re-rendered without the GPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UnknownGPUError
from ..hardware import GPUSpec, get_gpu
from . import plots as probe_plots
from .attention import pass_rates
from .claim_check import RULE

REPORT_NAME = "probe-report.md"


def _fmt(value: Any) -> str:
    """3 significant digits, thousands separated: 4221.3 -> '4,221', 0.00507 -> '0.00507'."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def _ceilings(profile: Mapping[str, Any], spec: GPUSpec | None) -> list[str]:
    c = profile.get("ceilings", {})
    lines = [
        "## Ceilings",
        "",
        "| what | measured | datasheet | fraction |",
        "| --- | ---: | ---: | ---: |",
    ]
    copy = c.get("copy_bytes_per_s")
    if copy:
        sheet = spec.memory_bandwidth_bytes_per_s if spec else None
        lines.append(
            f"| device-to-device copy (read + write) | {_fmt(copy / 1e9)} GB/s | "
            + (f"{sheet / 1e9:,.0f} GB/s | {copy / sheet:.0%} |" if sheet else "- | - |")
        )
    gemms = [(d, f, True) for d, f in c.get("gemm_flops", {}).items()]
    gemms += [(d, f, False) for d, f in c.get("gemm_flops_cuda_cores", {}).items()]
    sizes = ", ".join(f"{s}^3" for s in c.get("gemm_peak_sizes", []))
    for dtype, flops, tensor_cores in gemms:
        try:
            sheet = spec.peak_flops(dtype, tensor_cores=tensor_cores) if spec else None
        except ValueError:
            sheet = None
        where = "tensor cores" if tensor_cores else "CUDA cores, TF32 off"
        lines.append(
            f"| {dtype} GEMM ({where}; best of {sizes}) | {_fmt(flops / 1e12)} TFLOP/s | "
            + (f"{sheet / 1e12:,.1f} TFLOP/s | {flops / sheet:.0%} |" if sheet else "- | - |")
        )
    for key, label in (
        ("launch_overhead_s", "tiny kernel launch, eager"),
        ("graph_launch_overhead_s", "tiny kernel launch, CUDA graph"),
    ):
        if c.get(key) is not None:
            lines.append(f"| {label} | {c[key] * 1e6:.2f} us | - | - |")
    return [*lines, ""]


def _granularity_cell(cliff: Mapping[str, Any] | None) -> str:
    if not cliff:
        return "-"
    g = cliff["granularity"]
    if g == 1:
        return "none"
    aligned = cliff["aligned_relative"]
    fall = 1 - cliff["missed_relative"] / aligned if aligned else 0.0
    return f"**{g}** (-{fall:.0%})"


def _gemm_cliffs(
    profile: Mapping[str, Any], spec: GPUSpec | None, plots: dict[str, Path]
) -> list[str]:
    gemm = profile.get("cliffs", {}).get("gemm", {})
    lines = [
        "## GEMM alignment cliffs",
        "",
        "Granularity: sizes that are multiples of it run at full speed, sizes that miss it "
        "fall by more than the threshold (in brackets: the median fall). The profile's "
        "`tc_align_elems` takes the largest over dimensions and layouts.",
        "",
        "| dtype | layout | M | N | K | profile | datasheet rule |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    align = profile.get("tc_align_elems", {})
    for layout, by_dtype in gemm.items():
        for dtype, by_dim in by_dtype.items():
            rule = spec.tc_align_elems.get(dtype, "-") if spec else "-"
            cells = " | ".join(_granularity_cell(by_dim.get(d)) for d in ("M", "N", "K"))
            lines.append(f"| {dtype} | {layout} | {cells} | {align.get(dtype, '-')} | {rule} |")
    lines.append("")
    for layout, by_dtype in gemm.items():
        for dtype, by_dim in by_dtype.items():
            for dim in sorted(by_dim, key="MNK".find):
                lines.append(f"- {dtype} {layout} {dim}: {by_dim[dim]['evidence']}")
            if f"gemm-align-{dtype}-{layout}" in plots:
                name = plots[f"gemm-align-{dtype}-{layout}"].name
                lines.append(f"\n![{dtype} {layout} GEMM alignment](plots/{name})\n")
    return [*lines, ""]


def _conv_and_batch(profile: Mapping[str, Any], plots: dict[str, Path]) -> list[str]:
    cliffs = profile.get("cliffs", {})
    lines = [
        "## Convolution channels (channels_last)",
        "",
        "| dtype | sweep | granularity | evidence |",
        "| --- | --- | ---: | --- |",
    ]
    for dtype, by_sweep in cliffs.get("conv", {}).items():
        for name, cliff in by_sweep.items():
            lines.append(f"| {dtype} | {name} | {_granularity_cell(cliff)} | {cliff['evidence']} |")
    lines += [f"\n![{k}](plots/{p.name})\n" for k, p in plots.items() if k.startswith("conv")]
    lines += [
        "",
        "## Batch size",
        "",
        "Cliffs are looked for in windows of batch sizes around multiples of 128 (small "
        "batches are slow for other reasons and only plotted).",
        "",
    ]
    for name, cliff in cliffs.get("batch", {}).items():
        lines.append(f"- {name}: granularity {cliff['granularity']}; {cliff['evidence']}")
    if "batch" in plots:
        lines.append(f"\n![batch sweeps](plots/{plots['batch'].name})\n")
    wave = profile.get("wave_quantization", {})
    lines += ["", "## Wave quantization", ""]
    if "evidence" in wave:
        lines.append(
            f"{wave['dtype']} GEMM, N = K = {wave['n']}, M = 128 i, {wave['sm_count']} "
            f"SMs: {wave['evidence']}."
        )
    else:
        lines.append(f"Not measured: {wave.get('error', 'no wave sweep')}.")
    if "wave" in plots:
        lines.append(f"\n![wave quantization](plots/{plots['wave'].name})\n")
    latency = profile.get("gemm_latency") or {}
    lines += ["", "## GEMM kernel latency", ""]
    if latency.get("seconds") is not None:
        err = latency["median_abs_log_error"]
        lines.append(
            f"{latency['seconds'] * 1e6:.2f} us a GEMM or convolution kernel beyond its FLOPs at "
            f"the shape's rate (fill, epilogue, tail), fitted on {latency['points']} "
            f"{latency['workload']}: median |log(predicted / measured)| {err['without']:.3f} "
            f"without it, {err['with']:.3f} with it. The cost model adds it to every such kernel."
        )
    else:
        lines.append(
            "Not fitted (too few small GEMMs in these sweeps: the full probe fits it); the cost "
            "model keeps its default."
        )
    floor = profile.get("kernel_floor") or {}
    if floor.get("seconds") is not None:
        by_op = ", ".join(f"{op} {us:.2f}" for op, us in floor.get("by_op", {}).items())
        lines += [
            "",
            f"Kernel floor: {floor['seconds'] * 1e6:.2f} us, the shortest any other kernel runs "
            f"({floor.get('workload', 'tiny kernels')}; {by_op} us). The cost model prices no "
            "kernel but a matrix product's below it.",
        ]
    return [*lines, ""]


def _claims(profile: Mapping[str, Any], plots: dict[str, Path]) -> list[str]:
    claims = profile.get("guide_claims", [])
    lines = [
        "## The guide's rules of thumb on this GPU",
        "",
        f"Verdict rule: {RULE} Claims with their own rule state it below the table. "
        "Gain: how much faster the guide's advice makes the measured case (0.26 = 26%).",
        "",
        "| claim | the guide says | claimed | measured here | gain | verdict |",
        "| --- | --- | --- | --- | ---: | --- |",
    ]
    own_rules = []
    for c in claims:
        numbers = "; ".join(
            f"{k} {_fmt(v)}"
            for k, v in c.get("numbers", {}).items()
            if v is not None and k != "note"
        )
        if c.get("error"):
            numbers = f"error: {c['error']}"
        gain = "-" if c.get("gain") is None else f"{c['gain']:+.2f}"
        lines.append(
            f"| `{c['id']}` | {c['says']} ({c['where']}) | {c['claimed']} | {numbers} "
            f"| {gain} | **{c['verdict']}** |"
        )
        if c.get("rule") and c["rule"] != RULE:
            own_rules.append(f"- `{c['id']}`: {c['rule']}.")
    lines += ["", *own_rules, "", "How each was measured:", ""]
    lines += [
        f"- `{c['id']}`: {c['how']}."
        + (f" Note: {c['numbers']['note']}." if "note" in c.get("numbers", {}) else "")
        for c in claims
        if c.get("how")
    ]
    if "claims" in plots:
        lines.append(f"\n![claims](plots/{plots['claims'].name})\n")
    return [*lines, ""]


def _memory(profile: Mapping[str, Any]) -> list[str]:
    """Eager kernels' bandwidth per memory family (what the cost model prices bytes at)."""
    rows = profile.get("memory_efficiency") or {}
    if not rows:
        return []
    lines = [
        "## Eager kernels against the copy rate",
        "",
        "One training step per family, its bytes counted by gpushape's formulas, timed "
        "from a CUDA graph; the cost model divides each op's memory time by its family's "
        "fraction.",
        "",
        "| family | workload | fraction of copy rate | measured ms |",
        "| --- | --- | ---: | ---: |",
    ]
    for family, row in rows.items():
        if "error" in row:
            lines.append(f"| {family} | {row.get('workload', '')} | failed: {row['error']} | |")
        else:
            fraction = (
                "none: " + row.get("note", "not measured")
                if row.get("efficiency") is None
                else f"{row['efficiency']:.2f}"
            )
            lines.append(
                f"| {family} | {row['workload']} | {fraction} | {row['measured_s'] * 1e3:.3f} |"
            )
    nchw = rows.get("nchw_conversion") or {}
    if nchw.get("efficiency"):
        nchw_ms, cl_ms = nchw["measured_s"] * 1e3, nchw["channels_last_s"] * 1e3
        lines += [
            "",
            f"nchw_conversion is not a kernel: NCHW convolutions took {nchw_ms:.3f} "
            f"ms against {cl_ms:.3f} ms in channels_last, the difference priced as "
            f"cuDNN's layout conversions' {nchw['conversion_bytes'] / 1e9:.2f} GB at "
            f"{nchw['efficiency']:.2f} of the copy rate (the nchw-conv rule's price).",
        ]
    stem = profile.get("conv_small_cin") or {}
    if stem.get("efficiency"):
        lines += [
            "",
            f"A convolution on 3 input channels ({stem['workload']}) ran at "
            f"{stem['efficiency']:.3f} of the GEMM model's rate for its shape "
            f"({stem['measured_s'] * 1e3:.3f} ms against {stem['model_s'] * 1e3:.3f} "
            "ms): the cost model prices convolutions with fewer input channels per "
            "group than the tensor-core alignment at that rate.",
        ]
    return [*lines, ""]


def _attention(profile: Mapping[str, Any]) -> list[str]:
    rows = profile.get("attention") or {}
    if not rows:
        return []
    lines = [
        "## Fused attention against the GEMM model",
        "",
        "One SDPA call per configuration, forward and forward + backward from a CUDA "
        "graph; the cost model multiplies an attention kernel's GEMM efficiency by the "
        "fraction measured for its backend, pass and flags at the nearest head size.",
        "",
        "| workload | fwd fraction | fwd TFLOP/s | bwd fraction | bwd TFLOP/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows.values():
        if "error" in row:
            lines.append(f"| {row.get('workload', '')} | failed: {row['error']} | | | |")
            continue
        fwd, bwd = pass_rates(row)
        lines.append(
            f"| {row['workload']} | {fwd:.2f} | {row['tflops_fwd']:.0f} | {bwd:.2f} | "
            f"{row['tflops_bwd']:.0f} |"
        )
    return [*lines, ""]


def _host(profile: Mapping[str, Any]) -> list[str]:
    rows = {k: v for k, v in (profile.get("host") or {}).items() if isinstance(v, Mapping)}
    if not rows:
        return []
    lines = [
        "## The host's side of an eager step",
        "",
        "What one call costs this machine's CPU to dispatch (Python, the dispatcher, autograd's "
        "recording, a library's setup, the launch), by op class, forward and backward; the "
        "audit prices an eager step's host side with them and says whether the host or the GPU "
        "sets the pace.",
        "",
        "| what | us a call | workload |",
        "| --- | ---: | --- |",
    ]
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | failed | {row['error']} |")
            continue
        lines.append(f"| {name} | {row['seconds'] * 1e6:.1f} | {row.get('workload', '')} |")
    glue = rows.get("module_glue", {}).get("per_model")
    if glue:
        each = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in glue.items())
        lines += [
            "",
            f"A module call's own Python, model by model (us): {each}. One rate serves every "
            "model; their spread is how far it can be from any one.",
        ]
    return [*lines, ""]


def _optimizer(profile: Mapping[str, Any]) -> list[str]:
    rows = {k: v for k, v in (profile.get("optimizer_kernels") or {}).items()
            if isinstance(v, Mapping) and "efficiency" in v}  # fmt: skip
    if not rows:
        return []
    lines = [
        "## An optimizer step's kernels",
        "",
        "SGD and AdamW, foreach and fused, over a ResNet-50's parameters and a few large "
        "tensors: their bytes' rate and what each tensor adds to each kernel (how the audit "
        "prices a step).",
        "",
        "| implementation | fraction of copy rate | us a tensor a kernel |",
        "| --- | ---: | ---: |",
    ]
    for name, row in rows.items():
        per = row.get("tensor_seconds")
        lines.append(f"| {name} | {row['efficiency']:.2f} | "
                     f"{'' if per is None else f'{per * 1e6:.3f}'} |")  # fmt: skip
    if failed := (profile.get("optimizer_kernels") or {}).get("errors"):
        lines += ["", "Not measured: " + "; ".join(f"{k} ({v})" for k, v in failed.items())]
    return [*lines, ""]


def _header(profile: Mapping[str, Any]) -> list[str]:
    probe, sw = profile.get("probe", {}), profile.get("software", {})
    timing = probe.get("timing", {})
    versions = ", ".join(f"{k} {v}" for k, v in sw.items() if v is not None)
    return [
        f"# gpushape probe: {profile.get('device_name')} ({profile.get('gpu')})",
        "",
        f"Measured {profile.get('measured_at')} with {versions}; {probe.get('mode')} probe, "
        f"{timing.get('total_s', '?')} s; `{probe.get('command', '')}`.",
        "",
        f"Method: {probe.get('method', '-')}; {probe.get('repeats')} samples per point.",
        "",
    ]


def _spec(profile: Mapping[str, Any]) -> GPUSpec | None:
    try:
        return get_gpu(profile.get("gpu", ""))
    except UnknownGPUError:
        return None


def write_plots(profile: Mapping[str, Any], plot_dir: Path) -> dict[str, Path]:
    plots: dict[str, Path | None] = {}
    gemm = profile.get("cliffs", {}).get("gemm", {})
    for layout, by_dtype in gemm.items():
        for dtype in by_dtype:
            plots[f"gemm-align-{dtype}-{layout}"] = probe_plots.plot_gemm_align(
                profile, plot_dir, dtype, layout
            )
    for dtype in profile.get("cliffs", {}).get("conv", {}):
        plots[f"conv-{dtype}"] = probe_plots.plot_conv_channels(profile, plot_dir, dtype)
    plots["batch"] = probe_plots.plot_batch(profile, plot_dir)
    plots["wave"] = probe_plots.plot_wave(profile, plot_dir)
    plots["claims"] = probe_plots.plot_claims(profile, plot_dir)
    return {k: p for k, p in plots.items() if p is not None}


def write_report(profile: Mapping[str, Any] | str | Path, out_dir: str | Path) -> Path:
    """Write `probe-report.md` and `plots/*.png` into `out_dir`; returns the Markdown path."""
    if not isinstance(profile, Mapping):
        profile = json.loads(Path(profile).read_text())
    out_dir = Path(out_dir)
    plots = write_plots(profile, out_dir / "plots")
    spec = _spec(profile)
    lines = [
        *_header(profile),
        *_ceilings(profile, spec),
        *_memory(profile),
        *_attention(profile),
        *_host(profile),
        *_optimizer(profile),
        *_gemm_cliffs(profile, spec, plots),
        *_conv_and_batch(profile, plots),
        *_claims(profile, plots),
    ]
    path = out_dir / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
