"""benchmarks/hardware/rederive_attention.py: a fused-attention rate re-derived from a row's
stored GPU times prices that very call at its measured time, also where the GEMM model puts
the call's memory time above its compute time (short sequences), which a rate taken against
the model's whole kernel time did not."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from gpushape.hardware import get_gpu
from gpushape.hardware.profile import apply_profile, read_profile
from gpushape.probe.attention import AttentionConfig, _Attention
from gpushape.tracing.cost import op_cost
from gpushape.tracing.tracer import trace

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (64, 12, 197)  # ViT-B/16's calls at batch 64
MEASURED = (46.5e-6, 114.0e-6)  # the H200's cuDNN kernels for them (loops-h200-5)


@pytest.fixture
def mod(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "hardware"))
    return __import__("rederive_attention")


def _row(rates: dict[str, float]) -> dict:
    return {
        **rates,
        "workload": "default attention, head size 64, sequences of 197, 64x12x197x64",
        "measured_fwd_s": MEASURED[0],
        "measured_bwd_s": MEASURED[1],
    }


def _priced(spec, cfg: AttentionConfig) -> tuple[float, float]:
    b, h, t = SHAPE
    qkv = tuple(
        torch.empty(b, h, t, cfg.head_dim, dtype=torch.bfloat16, device="meta", requires_grad=True)
        for _ in range(3)
    )
    times = {"forward": 0.0, "backward": 0.0}
    for rec in trace(_Attention(cfg), qkv, train=True).ops:
        if "scaled_dot_product" in rec.op:
            times[rec.phase] += op_cost(rec, spec).kernel_time_s
    return times["forward"], times["backward"]


def test_the_rederived_rate_prices_the_measured_call_at_its_measured_time(mod):
    spec = get_gpu("h200")
    cfg = AttentionConfig("default", 64, seq=197)
    old = {cfg.key(False): 0.9, cfg.key(True): 0.9}
    new = mod.rederive(_row(old), spec)
    assert new is not None and new["rederived"]["from"] == old
    rates = {k: new[k] for k in old}
    fast = spec.replace(achievable=dataclasses.replace(spec.achievable, attention=rates))
    fwd, bwd = _priced(fast, cfg)
    assert fwd == pytest.approx(MEASURED[0], rel=0.01)
    assert bwd == pytest.approx(MEASURED[1], rel=0.01)


def test_the_model_side_is_the_compute_time_not_the_memory_time(mod):
    # at 197 tokens and head size 64 the model's memory time is above its compute time, so a
    # rate taken against the kernel time (the larger) would be higher than the compute's
    spec = get_gpu("h200")
    cfg = AttentionConfig("default", 64, seq=197)
    new = mod.rederive(_row({cfg.key(False): 0.9, cfg.key(True): 0.9}), spec)
    flat_fwd, _ = _priced(
        spec.replace(achievable=dataclasses.replace(spec.achievable, attention={})), cfg
    )
    assert new["model_fwd_s"] < flat_fwd
    assert new[cfg.key(False)] == pytest.approx(new["model_fwd_s"] / MEASURED[0], abs=1e-4)


def test_rows_of_other_scripts_and_unmoved_rows_are_left(mod):
    spec = get_gpu("h200")
    shipped = read_profile(ROOT / "src/gpushape/hardware/profiles/h200-sxm.json")["attention"]
    for name in ("default/d64", "cudnn_masked/d64"):  # attention_from_runs, fit_masked_sdpa
        assert mod.rederive(copy.deepcopy(shipped[name]), spec) is None
    spec = apply_profile(get_gpu("h200"), read_profile(mod.DEFAULT))
    row = copy.deepcopy(shipped["flash/d64"])  # measured by the probe at 1024: compute-bound
    assert mod.rederive(row, spec) is row


def test_a_key_names_its_configuration_and_pass(mod):
    cfg, backward = mod.config_of("default/bwd/dropout/causal/gqa/d128@t256")
    assert backward and cfg == AttentionConfig(
        "default", 128, dropout=0.1, causal=True, gqa=True, seq=256
    )
    with pytest.raises(ValueError, match="not an attention rate"):
        mod.config_of("norm@768")
