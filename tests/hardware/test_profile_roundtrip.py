"""A profile written by the probe's writer (fed synthetic measurements) reads back through the
hardware layer and changes the spec; bundled profiles calibrate their chip only."""

import json
from pathlib import Path

import pytest

from gpushape.errors import ProfileError
from gpushape.hardware import get_gpu, load_profile, profile
from gpushape.probe.measure import MeasureConfig
from gpushape.probe.plan import quick_plan
from gpushape.probe.profile import analyze, build_profile, write_profile

TFLOP = 1e12


def _align_rows(dtype, granularity, fast_tflops):
    rows = []
    for dim in "MNK":
        for size in (4096 + o for o in (-4, -1, 0, 1, 2, 4, 8, 12, 16, 24, 32, 64, 128)):
            mnk = {d: size if d == dim.lower() else 8192 for d in "mnk"}
            tflops = fast_tflops if size % granularity == 0 else 0.2 * fast_tflops
            rows.append(
                {
                    "dtype": dtype,
                    "layout": "nn",
                    **mnk,
                    "dim": dim,
                    "base": 4096,
                    "size": size,
                    "time_s": 2 * size * 8192**2 / (tflops * TFLOP),
                    "flops_per_s": tflops * TFLOP,
                }
            )
    return rows


def _profile(spec, *, bf16_granularity=16):
    sweeps = {
        "gemm_peak": [
            {"dtype": d, "size": 8192, "flops_per_s": f * TFLOP}
            for d, f in (("bf16", 700.0), ("tf32", 400.0), ("fp32", 50.0))
        ],
        "gemm_align": _align_rows("bf16", bf16_granularity, 650.0) + _align_rows("tf32", 4, 380.0),
    }
    ceilings = {
        "copy_bytes_per_s": 4.0e12,
        "launch_overhead_s": 7e-6,
        "graph_launch_overhead_s": 1.2e-6,
    }
    return build_profile(
        plan=quick_plan(),
        spec=spec,
        cfg=MeasureConfig(device="cpu"),
        ceilings=ceilings,
        sweeps=sweeps,
        analysis=analyze(sweeps, spec),
        claims=[],
        timing={"total_s": 1.0},
    )


def test_written_profile_loads_and_calibrates(tmp_path):
    datasheet = get_gpu("h200")
    path = write_profile(_profile(datasheet), tmp_path / "h200.json")
    spec = load_profile(path)
    a = spec.achievable
    assert a.gemm("bf16") == pytest.approx(700 * TFLOP / datasheet.peak_flops("bf16"))
    assert a.gemm("tf32") == pytest.approx(400 * TFLOP / datasheet.peak_flops("tf32"))
    assert a.memory_bandwidth_fraction == pytest.approx(4.0e12 / 4.8e12)
    assert a.launch_overhead_s == 7e-6 and a.graph_launch_overhead_s == 1.2e-6
    assert a.source.startswith("measured") and "memory_bandwidth_fraction" in a.measured
    # fp32 with TF32 off runs on CUDA cores: kept apart, not read as a TF32 fraction
    assert "fp32" not in a.gemm_fraction
    # the measured cliffs replace the datasheet's 16-byte rule
    assert spec.tc_alignment("bf16") == 16 != datasheet.tc_alignment("bf16")
    assert spec.tc_alignment("tf32") == 4
    assert "tc_align_elems" in spec.overridden


def test_profile_file_is_valid_json_with_one_row_per_line(tmp_path):
    path = write_profile(_profile(get_gpu("h200"), bf16_granularity=8), tmp_path / "p.json")
    text = path.read_text()
    data = json.loads(text)
    assert data["format"] == "gpushape-profile" and data["version"] == 1
    assert data["tc_align_elems"] == {"bf16": 8, "tf32": 4}
    assert data["ceilings"]["gemm_flops_cuda_cores"] == {"fp32": 50 * TFLOP}
    rows = sum(len(r) for r in data["sweeps"].values())
    assert rows == 3 + 2 * 3 * 13
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith('{"dtype"')) == rows


def test_bundled_profile_calibrates_its_chip_only(tmp_path, monkeypatch):
    monkeypatch.setattr(profile, "PROFILES_DIR", tmp_path)
    h200 = get_gpu("h200")
    assert profile.bundled_profile_path("h200") is None
    assert profile.calibrated("h200") is h200
    write_profile(_profile(h200), tmp_path / "h200-sxm.json")
    assert profile.bundled_profile_path("nvidia h200") == tmp_path / "h200-sxm.json"
    spec = profile.calibrated("h200")
    assert spec.tc_alignment("bf16") == 16 and "h200-sxm.json" in spec.achievable.source
    assert profile.calibrated("h100") is get_gpu("h100")  # other chips keep the datasheet


def test_bundled_profile_for_another_chip_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(profile, "PROFILES_DIR", tmp_path)
    write_profile(_profile(get_gpu("h100")), tmp_path / "h200-sxm.json")
    with pytest.raises(ProfileError, match="is for 'h100-sxm', not 'h200-sxm'"):
        profile.calibrated("h200")


def test_memory_efficiency_is_read_from_a_profile():
    from gpushape.hardware import get_gpu
    from gpushape.hardware.profile import apply_profile

    profile = {
        "format": "gpushape-profile",
        "version": 1,
        "gpu": "h200-sxm",
        "memory_efficiency": {
            "norm": {"efficiency": 0.4, "workload": "..."},
            "pool": {"error": "failed"},
        },
        "conv_small_cin": {"efficiency": 0.07},
    }
    spec = apply_profile(get_gpu("h200"), profile)
    assert spec.achievable.memory("norm") == 0.4
    assert spec.achievable.memory("pool") == 1.0  # a failed measurement keeps the copy rate
    assert spec.achievable.memory(None) == 1.0
    assert "memory_efficiency" in spec.achievable.measured
    assert spec.achievable.small_cin_conv == 0.07


def test_attention_rates_are_read_from_a_profile_and_looked_up_by_kernel():
    from gpushape.hardware import get_gpu
    from gpushape.hardware.profile import apply_profile

    profile = {
        "format": "gpushape-profile",
        "version": 1,
        "gpu": "h200-sxm",
        "attention": {
            "flash/d64": {
                "flash/fwd/d64": 0.5,
                "flash/bwd/d64": 0.3,
                "workload": "...",
                "measured_fwd_s": 1e-4,
            },
            "flash/d128": {"flash/fwd/d128": 0.7, "flash/bwd/d128": 0.45},
            "flash/dropout/d64": {"flash/fwd/dropout/d64": 0.4, "flash/bwd/dropout/d64": 0.25},
            "efficient/d64": {"error": "no kernel"},
        },
    }
    a = apply_profile(get_gpu("h200"), profile).achievable
    assert "attention" in a.measured
    assert a.attention_rate("flash", False, False, False, 64) == 0.5
    assert a.attention_rate("flash", True, False, False, 128) == 0.45
    # the nearest measured head size, on a log scale: 96 sits between 64 and 128 (ties: smaller)
    assert a.attention_rate("flash", False, False, False, 32) == 0.5
    assert a.attention_rate("flash", False, False, False, 256) == 0.7
    assert a.attention_rate("flash", False, False, False, 100) == 0.7
    # dropout measured at 64 only: the nearest size with dropout, not the plain kernel at 128
    assert a.attention_rate("flash", True, True, False, 128) == 0.25
    # causal not measured: the same kernel without the flag
    assert a.attention_rate("flash", False, True, True, 64) == 0.4
    # a backend with no (or a failed) measurement keeps the GEMM model's rate
    assert a.attention_rate("efficient", False, False, False, 64) == 1.0
    assert a.attention_rate("cudnn", True, False, False, 64) == 1.0
    assert get_gpu("h100").achievable.attention_rate("flash", False, False, False, 64) == 1.0


def test_a_flash_call_takes_the_rate_of_what_sdpa_picks_by_itself_and_grouped_query_its_own():
    from gpushape.hardware import get_gpu
    from gpushape.hardware.profile import apply_profile

    profile = {
        "format": "gpushape-profile",
        "version": 1,
        "gpu": "h200-sxm",
        "attention": {
            "flash/causal/d64": {"flash/fwd/causal/d64": 0.24, "flash/bwd/causal/d64": 0.19},
            "default/causal/d64": {"default/fwd/causal/d64": 0.5, "default/bwd/causal/d64": 0.4},
            "default/causal/gqa/d64": {
                "default/fwd/causal/gqa/d64": 0.3,
                "default/bwd/causal/gqa/d64": 0.2,
            },
            "efficient/d64": {"efficient/fwd/d64": 0.16, "efficient/bwd/d64": 0.13},
        },
    }
    a = apply_profile(get_gpu("h200"), profile).achievable
    # SDPA's own choice (cuDNN's kernel on the H200) rather than the forced flash kernel
    assert a.attention_rate("flash", False, False, True, 64) == 0.5
    assert a.attention_rate("flash", True, False, True, 64, gqa=True) == 0.2
    # a causal row never stands in for a full one: none measured here, the GEMM model's rate
    assert a.attention_rate("flash", False, False, False, 64, gqa=True) == 1.0
    # other backends keep their own
    assert a.attention_rate("efficient", False, False, False, 64) == 0.16
    # a profile without "default" rows: the flash kernel's, as before
    old = {**profile, "attention": {"flash/causal/d64": profile["attention"]["flash/causal/d64"]}}
    b = apply_profile(get_gpu("h200"), old).achievable
    assert b.attention_rate("flash", False, False, True, 64, gqa=True) == 0.24


def _gemm_rows(spec, latency_s: float) -> list[dict]:
    """bf16 GEMM sweep rows timed as the cost model prices them with `latency_s`."""
    from gpushape.tracing.flops.registry import Gemm
    from gpushape.tracing.gemm_model import gemm_efficiency

    rows = []
    for m in [1, 8, 32, *range(64, 2049, 32)]:
        n = k = 4096
        eff = gemm_efficiency(Gemm(m=m, n=n, k=k, flops=2 * m * n * k), spec, "bf16")
        compute = 2 * m * n * k / (spec.attainable_flops("bf16") * eff.efficiency) + latency_s
        memory = 2 * (m * k + k * n + m * n) / spec.attainable_bandwidth_bytes_per_s()
        rows.append({"dtype": "bf16", "m": m, "n": n, "k": k, "time_s": max(compute, memory)})
    return rows


def test_the_gemm_latency_is_fitted_on_the_sweeps_and_read_from_a_profile():
    """The probe fits a GEMM kernel's latency on its small GEMMs' times (the cost model
    prices each kernel with it); the profile carries it to every audit on that chip."""
    from gpushape.probe.profile import fit_gemm_latency

    spec = get_gpu("h200")
    fit = fit_gemm_latency({"gemm_batch": _gemm_rows(spec, 5e-6)}, spec)
    assert fit["seconds"] == pytest.approx(5e-6)
    assert fit["median_abs_log_error"]["with"] < 0.01 < fit["median_abs_log_error"]["without"]
    assert fit_gemm_latency({"gemm_batch": _gemm_rows(spec, 5e-6)[:10]}, spec) == {}  # too few
    calibrated = profile.apply_profile(spec, {"gemm_latency": fit})
    assert calibrated.achievable.gemm_latency_s == pytest.approx(5e-6)
    assert "gemm_latency_s" in calibrated.achievable.measured
    assert profile.apply_profile(spec, {}).achievable.gemm_latency_s == 4e-6  # the default


def test_the_kernel_floor_is_read_from_a_profile_and_unmeasured_on_a_cpu():
    """The probe's kernel floor (probe/memory.py) reaches every audit on that chip; a CPU has
    no kernels to time, so there it is not measured and the default stands."""
    from gpushape.probe.memory import measure_kernel_floor

    spec = get_gpu("h200")
    calibrated = profile.apply_profile(spec, {"kernel_floor": {"seconds": 2.5e-6, "kernels": 5}})
    assert calibrated.achievable.kernel_floor_s == pytest.approx(2.5e-6)
    assert "kernel_floor_s" in calibrated.achievable.measured
    assert profile.apply_profile(spec, {"kernel_floor": {}}).achievable.kernel_floor_s == 1.5e-6
    assert measure_kernel_floor("cpu") is None


def test_the_h100_ships_the_profile_its_results_were_measured_with():
    """The H100's profile (benchmarks/results/probe-h100/h100-sxm.json, where each lease's
    rows are merged) ships as it is: a merge there must be copied here too."""
    root = Path(__file__).resolve().parents[2]
    results = root / "benchmarks/results/probe-h100/h100-sxm.json"
    shipped = profile.bundled_profile_path("h100")
    assert shipped is not None and shipped.read_bytes() == results.read_bytes()
    spec = profile.calibrated("h100")
    assert spec.achievable.host and spec.achievable.device_gap  # its measured host and gaps


def test_a_spec_calibrated_by_its_caller_is_not_calibrated_again():
    """resolve_target lays the shipped profile over a named chip, never over a GPUSpec that
    apply_profile already calibrated: its rows would replace the caller's."""
    from gpushape.auditing.target import resolve_target

    mine = {"memory_efficiency": {"softmax": {"efficiency": 0.123}}}
    spec = profile.apply_profile(get_gpu("h200"), mine, origin="my.json")
    target = resolve_target(spec)
    assert target.spec is spec and target.calibration == "my.json"
    assert target.spec.achievable.memory_efficiency["softmax"] == 0.123
    shipped = resolve_target("h200")
    assert shipped.calibration == "bundled profile h200-sxm.json"
    assert shipped.spec.achievable.memory_efficiency["softmax"] != 0.123
    assert resolve_target(get_gpu("h200")).calibration == shipped.calibration  # the catalog's


def test_calibrated_keeps_a_spec_already_calibrated():
    spec = profile.apply_profile(get_gpu("h100"), {"host": {"x": {"seconds": 1e-3}}}, "a.json")
    assert profile.calibrated_by(spec) == "a.json" and profile.calibrated(spec) is spec
    assert profile.calibrated_by(get_gpu("h200")) is None  # the catalog's, measured fields or not
    shipped = profile.calibrated("h100")
    assert profile.calibrated_by(shipped).endswith("h100-sxm.json")
