"""Report generation from synthetic sweep data: Markdown with the cliffs and verdicts, and PNGs."""

import math
import random

import pytest

from gpushape.hardware import get_gpu
from gpushape.probe.claim_check import Claim, ClaimContext, Measured, run_claims
from gpushape.probe.cliffs import tile_count, wave_efficiency
from gpushape.probe.measure import MeasureConfig
from gpushape.probe.plan import FULL_OFFSETS, full_plan
from gpushape.probe.profile import analyze, build_profile, write_profile
from gpushape.probe.report import REPORT_NAME, write_report

T = 1e12
rng = random.Random(0)


def _noisy(x):
    return x * (1 + rng.uniform(-0.03, 0.03))


def _gemm_rows(dtype, granularity, fast):
    rows = []
    for base, other in ((1024, 16384), (4096, 8192)):
        for dim in "MNK":
            for size in (base + o for o in FULL_OFFSETS):
                mnk = {d: size if d == dim.lower() else other for d in "mnk"}
                # like the H200 in bf16: M does not care, N and K fall off a cliff
                slow = dim != "M" and size % granularity != 0
                rows.append(
                    {
                        "dtype": dtype,
                        "layout": "nn",
                        **mnk,
                        "dim": dim,
                        "base": base,
                        "size": size,
                        "flops_per_s": _noisy(fast * (0.2 if slow else 1) * T),
                    }
                )
    return rows


def _conv_rows():
    rows = []
    for name, base in (("3x3 cin", 64), ("1x1 cin", 256)):
        for size in range(base - 4, base + 65, 1 if base == 64 else 4):
            rows.append(
                {
                    "dtype": "bf16",
                    "sweep": name,
                    "dim": "cin",
                    "base": base,
                    "size": size,
                    "flops_per_s": _noisy((240 if size % 8 == 0 else 170) * T),
                }
            )
    return rows


def _batch_rows(name):
    sizes = [1, 32, 64, *range(120, 137), *range(248, 265), 512]
    return [
        {
            "dtype": "bf16",
            "size": b,
            "dim": "batch",
            "flops_per_s": _noisy(600 * T * min(1.0, b / 256 + 0.3)),
        }
        for b in sizes
    ]


def _wave_rows(sms=132, n=4096):
    return [
        {
            "dtype": "bf16",
            "layout": "nn",
            "m": m,
            "n": n,
            "k": n,
            "size": m,
            "flops_per_s": _noisy(700 * T * wave_efficiency(tile_count(m, n, (128, 256)), sms)),
        }
        for m in (128 * i for i in range(1, 65))
    ]


def _claims(ctx):
    def measured(gain):
        return lambda c: Measured(
            gain=gain, numbers={"a_ms": 1.0, "b_ms": 1.0 + gain}, how="synthetic"
        )

    claims = [
        Claim(
            id="conv-channels-63-vs-64",
            where="§2.1",
            says="63 channels: 35% slower",
            claimed="35%",
            claimed_gain=0.54,
            measure=measured(0.41),
        ),
        Claim(
            id="batch-127-vs-128",
            where="§3.1",
            says="+26%",
            claimed="+26%",
            claimed_gain=0.26,
            measure=measured(0.001),
        ),
        Claim(
            id="broken",
            where="§0",
            says="-",
            claimed="-",
            claimed_gain=0.2,
            measure=lambda c: 1 / 0,
        ),
    ]
    return run_claims(claims, ctx)


@pytest.fixture(scope="module")
def synthetic_profile():
    spec = get_gpu("h200")
    sweeps = {
        "gemm_peak": [
            {"dtype": "bf16", "size": 8192, "flops_per_s": 790 * T},
            {"dtype": "fp32", "size": 8192, "flops_per_s": 51 * T},
        ],
        "gemm_align": _gemm_rows("bf16", 8, 700) + _gemm_rows("tf32", 4, 400),
        "conv_channels": _conv_rows(),
        "gemm_batch": _batch_rows("gemm_batch"),
        "conv_batch": _batch_rows("conv_batch"),
        "wave": _wave_rows(),
    }
    ceilings = {
        "copy_bytes_per_s": 4.2e12,
        "launch_overhead_s": 6.9e-6,
        "graph_launch_overhead_s": 1.1e-6,
    }
    analysis = analyze(sweeps, spec)
    ctx = ClaimContext(
        cfg=MeasureConfig(device="cpu"),
        mode="full",
        spec=spec,
        ceilings=ceilings,
        sweeps=sweeps,
        analysis=analysis,
    )
    return build_profile(
        plan=full_plan(),
        spec=spec,
        cfg=ctx.cfg,
        ceilings=ceilings,
        sweeps=sweeps,
        analysis=analysis,
        claims=_claims(ctx),
        timing={"total_s": 200.0},
    )


def test_analysis_of_synthetic_sweeps(synthetic_profile):
    p = synthetic_profile
    assert p["tc_align_elems"] == {"bf16": 8, "tf32": 4}
    gemm = p["cliffs"]["gemm"]["nn"]["bf16"]
    assert gemm["M"]["granularity"] == 1 and gemm["K"]["granularity"] == 8
    assert p["cliffs"]["conv"]["bf16"]["3x3 cin"]["granularity"] == 8
    assert set(p["cliffs"]["batch"]) == {"gemm_batch", "conv_batch"}
    assert all(c["granularity"] == 1 for c in p["cliffs"]["batch"].values())
    assert p["wave_quantization"]["found"] and p["wave_quantization"]["tile"] == [128, 256]
    verdicts = {c["id"]: c["verdict"] for c in p["guide_claims"]}
    assert verdicts == {
        "conv-channels-63-vs-64": "holds",
        "batch-127-vs-128": "does not hold",
        "broken": "not measured",
    }
    assert "ZeroDivisionError" in p["guide_claims"][2]["error"]


def test_report_markdown_and_plots(synthetic_profile, tmp_path):
    md_path = write_report(synthetic_profile, tmp_path)
    assert md_path == tmp_path / REPORT_NAME
    md = md_path.read_text()
    for text in (
        "## Ceilings",
        "4,200 GB/s",
        "88%",
        "| bf16 | nn | none | **8** (-",
        "| 8 | 8 |",
        "## Wave quantization",
        "wave quantization visible",
        "**holds**",
        "**does not hold**",
        "error: ZeroDivisionError",
        "Verdict rule: holds if",
    ):
        assert text in md, text
    pngs = {p.name for p in (tmp_path / "plots").glob("*.png")}
    assert pngs == {
        "gemm-align-bf16-nn.png",
        "gemm-align-tf32-nn.png",
        "conv-channels-bf16.png",
        "batch.png",
        "wave.png",
        "guide-claims.png",
    }
    for name in pngs:
        assert f"(plots/{name})" in md
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    assert "## GEMM kernel latency" in md and "Not fitted" in md  # the synthetic sweeps: too few


def test_report_states_the_fitted_gemm_latency(synthetic_profile, tmp_path):
    fit = {
        "seconds": 3.25e-6,
        "points": 41,
        "median_abs_log_error": {"without": 0.224, "with": 0.087},
        "workload": "bf16 GEMMs of the wave, gemm_batch, gemm_align sweeps under 100 us",
    }
    md = write_report({**synthetic_profile, "gemm_latency": fit}, tmp_path).read_text()
    assert "3.25 us a GEMM or convolution kernel" in md and "0.224 without it, 0.087" in md
    assert "Kernel floor" not in md  # not measured: not claimed


def test_report_states_the_measured_kernel_floor(synthetic_profile, tmp_path):
    floor = {"seconds": 1.2e-6, "by_op": {"add": 1.1, "sum": 1.9}, "workload": "tiny kernels"}
    md = write_report({**synthetic_profile, "kernel_floor": floor}, tmp_path).read_text()
    assert "Kernel floor: 1.20 us" in md and "add 1.10, sum 1.90 us" in md


def test_report_renders_again_from_the_profile_file(synthetic_profile, tmp_path):
    path = write_profile(synthetic_profile, tmp_path / "profile.json")
    md = write_report(path, tmp_path / "again").read_text()
    assert "gpushape probe:" in md and math.isfinite(len(md))


def test_report_has_the_attention_rates_when_the_profile_does(synthetic_profile, tmp_path):
    profile = {
        **synthetic_profile,
        "attention": {
            "flash/d64": {
                "flash/fwd/d64": 0.36,
                "flash/bwd/d64": 0.28,
                "tflops_fwd": 271.0,
                "tflops_bwd": 209.0,
                "workload": "flash attention, head size 64, 8x16x1024x64",
            },
            "efficient/d64": {
                "error": "RuntimeError: no kernel",
                "workload": "efficient attention",
            },
        },
    }
    md = write_report(profile, tmp_path).read_text()
    assert "## Fused attention against the GEMM model" in md
    assert "| flash attention, head size 64, 8x16x1024x64 | 0.36 | 271 | 0.28 | 209 |" in md
    assert "| efficient attention | failed: RuntimeError: no kernel |" in md


def test_report_has_the_host_rates_and_the_glue_per_model(synthetic_profile, tmp_path):
    assert "## The host's side" not in write_report(synthetic_profile, tmp_path / "a").read_text()
    profile = {
        **synthetic_profile,
        "host": {
            "op": {"seconds": 1.2e-5, "workload": "y * 1.0001", "calls": 2000},
            "conv/error": {"error": "RuntimeError: no cuDNN"},
            "module_glue": {
                "seconds": 2.25e-5,
                "workload": "fitted on a, b",
                "per_model": {"a": 1.0e-5, "b": 4.0e-5},
            },
        },
    }
    md = write_report(profile, tmp_path / "b").read_text()
    assert "## The host's side of an eager step" in md
    assert "| op | 12.0 | y * 1.0001 |" in md and "| module_glue | 22.5 | fitted on a, b |" in md
    assert "| conv/error | failed | RuntimeError: no cuDNN |" in md
    assert "model by model (us): a 10.0, b 40.0." in md


def test_memory_section_explains_the_nchw_row_and_shows_an_unmeasured_one():
    from gpushape.probe.report import _memory

    nchw = {
        "efficiency": 0.4,
        "workload": "bottlenecks",
        "measured_s": 3e-3,
        "channels_last_s": 1e-3,
        "conversion_bytes": 3.4e9,
    }
    text = "\n".join(_memory({"memory_efficiency": {"nchw_conversion": nchw}}))
    assert "| nchw_conversion | bottlenecks | 0.40 | 3.000 |" in text
    assert "took 3.000 ms against 1.000 ms in channels_last" in text and "3.40 GB" in text
    quiet = dict(nchw, efficiency=None, note="NCHW ran no slower than channels_last")
    text = "\n".join(_memory({"memory_efficiency": {"nchw_conversion": quiet}}))
    assert "none: NCHW ran no slower" in text and "took" not in text


def test_report_has_the_optimizer_kernels_when_the_profile_does(synthetic_profile, tmp_path):
    assert (
        "## An optimizer step's" not in write_report(synthetic_profile, tmp_path / "a").read_text()
    )
    profile = {
        **synthetic_profile,
        "optimizer_kernels": {
            "foreach": {"efficiency": 0.86, "tensor_seconds": 1.34e-7},
            "foreach/SGD": {"efficiency": 0.89},
            "errors": {"fused/AdamW": "RuntimeError: no fused kernel here"},
        },
    }
    md = write_report(profile, tmp_path / "b").read_text()
    assert "## An optimizer step's kernels" in md
    assert "| foreach | 0.86 | 0.134 |" in md and "| foreach/SGD | 0.89 |  |" in md
    assert "Not measured: fused/AdamW (RuntimeError: no fused kernel here)" in md
