"""The shipped H200 profile's "default" attention rates (SDPA's own pick), where they came from
benchmarks/hardware/attention_from_runs.py, are what it derives from the committed H200 runs'
kernel times: the profile cannot drift from its sources (rows the probe measured since stand)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_default_rates_are_those_the_committed_runs_give(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    mod = __import__("attention_from_runs")
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile, read_profile

    profile = read_profile(mod.PROFILE)
    spec = apply_profile(get_gpu(profile["gpu"]), profile, origin="test")
    derived = mod.rows(spec)
    shipped = profile["attention"]
    assert {"default/causal/d64", "default/dropout/d64", "default/d64"} <= set(derived)
    for name, row in derived.items():
        rates = {k: v for k, v in row.items() if k.startswith("default/")}
        assert rates and all(0 < v <= 1 for v in rates.values())
        assert "cudnn" in json.dumps(row["kernels"]) and row["source"]
        if "attention_from_runs" not in str(shipped.get(name, {}).get("source", "")):
            continue  # the probe has measured this one since: its own row stands
        assert {k: shipped[name][k] for k in rates} == pytest.approx(rates, rel=1e-3)


def test_a_causal_call_is_priced_at_cudnns_rate_not_the_forced_flash_kernels():
    from gpushape.hardware.profile import calibrated

    a = calibrated("h200-sxm").achievable
    # at this shape cuDNN's causal kernel ran about twice the forced FlashAttention-2's rate
    assert (
        a.attention_rate("flash", True, False, True, 64) > 1.5 * a.attention["flash/bwd/causal/d64"]
    )


@pytest.mark.parametrize(
    "profile",
    ["src/gpushape/hardware/profiles/h200-sxm.json", "benchmarks/results/probe-h100/h100-sxm.json"],
)
def test_the_attention_pass_rate_is_what_the_committed_runs_give(monkeypatch, profile):
    """The "attention_pass" family (a fused backward's row sums and dQ conversion) in the shipped
    H200 profile and the H100 probe's, against attention_pass_from_runs.py's derivation from
    each chip's committed BERT step: the kernels named, about half the copy rate."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    mod = __import__("attention_pass_from_runs")
    from gpushape.hardware.lookup import get_gpu
    from gpushape.hardware.profile import apply_profile, read_profile

    data = read_profile(ROOT / profile)
    spec = apply_profile(get_gpu(data["gpu"]), data, origin="test")
    flat = spec.replace(
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={})
    )  # the copy rate
    derived = mod.row(data["gpu"], flat)
    shipped = data["memory_efficiency"]["attention_pass"]
    assert shipped["efficiency"] == pytest.approx(derived["efficiency"], rel=1e-3)
    assert 0.3 < derived["efficiency"] < 0.9
    assert len(derived["kernels"]) == 2
