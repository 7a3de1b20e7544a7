"""probe_attention's plumbing on the CPU (tiny SDPA calls): the model time it divides by is the
GEMM model's for the traced call, each configuration yields one key per pass, failures are
reported, and the rates reach the cost model through a profile."""

from __future__ import annotations

import pytest
import torch

from gpushape.hardware import get_gpu
from gpushape.probe import attention as probe_attention
from gpushape.probe import plan as probe_plan
from gpushape.probe.attention import AttentionConfig

SHAPE = (1, 2, 16)


def test_the_model_time_covers_both_passes_with_the_attention_flops():
    spec = get_gpu("h200")
    b, h, t = 2, 4, 256
    fwd_s, bwd_s, fwd_flops, bwd_flops = probe_attention.model_s(
        spec, AttentionConfig("flash", 64), (b, h, t), torch.bfloat16
    )
    assert fwd_flops == 4 * b * h * t * t * 64  # QK^T and PV
    assert bwd_flops == pytest.approx(2.5 * fwd_flops)
    assert 0 < fwd_s < bwd_s
    causal = probe_attention.model_s(
        spec, AttentionConfig("flash", 64, causal=True), (b, h, t), torch.bfloat16
    )
    assert causal[2] == 2 * b * h * t * (t + 1) * 64  # only the unmasked pairs


def test_each_configuration_gives_a_forward_and_a_backward_rate():
    spec = get_gpu("h200")
    configs = (AttentionConfig("flash", 64), AttentionConfig("efficient", 128, dropout=0.1))
    rows = probe_attention.measure_attention(spec, device="cpu", shape=SHAPE, configs=configs)
    assert set(rows) == {"flash/d64", "efficient/dropout/d128"}
    row = rows["efficient/dropout/d128"]
    for key in ("efficient/fwd/dropout/d128", "efficient/bwd/dropout/d128"):
        assert 0.01 <= row[key] <= 1.0
    assert row["model_fwd_s"] > 0 and row["measured_fwd_s"] > 0
    assert row["efficient/fwd/dropout/d128"] == pytest.approx(
        min(max(row["model_fwd_s"] / row["measured_fwd_s"], 0.01), 1.0), abs=1e-4
    )
    from gpushape.hardware.profile import attention_rates

    assert probe_attention.pass_rates(row) == (
        row["efficient/fwd/dropout/d128"],
        row["efficient/bwd/dropout/d128"],
    )
    flat = attention_rates(rows)
    assert set(flat) == {
        "flash/fwd/d64",
        "flash/bwd/d64",
        "efficient/fwd/dropout/d128",
        "efficient/bwd/dropout/d128",
    }


def test_a_configuration_that_cannot_run_is_reported(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("No available kernel")

    monkeypatch.setattr(probe_attention, "measure_config", broken)
    rows = probe_attention.measure_attention(
        get_gpu("h200"), device="cpu", shape=SHAPE, configs=(AttentionConfig("flash", 64),)
    )
    assert rows == {
        "flash/d64": {
            "error": "RuntimeError: No available kernel",
            "workload": "flash attention, head size 64",
        }
    }


def test_measured_rates_slow_the_cost_model_s_attention():
    """A profile's attention rates divide into the fused kernel's predicted rate, per pass."""
    from gpushape.hardware.profile import apply_profile
    from gpushape.tracing import trace
    from gpushape.tracing.cost import cost

    spec = get_gpu("h200")
    profile = {
        "format": "gpushape-profile",
        "version": 1,
        "gpu": "h200-sxm",
        "attention": {
            "flash/dropout/d64": {"flash/fwd/dropout/d64": 0.5, "flash/bwd/dropout/d64": 0.25}
        },
    }
    calibrated = apply_profile(spec, profile)
    qkv = tuple(
        torch.empty(4, 8, 512, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
        for _ in range(3)
    )
    model = probe_attention._Attention(AttentionConfig("flash", 64, dropout=0.1))
    t = trace(model, qkv, train=True)
    before, after = (
        {op.phase: op for op in cost(t, s).ops if "flash" in op.op} for s in (spec, calibrated)
    )
    assert after["forward"].compute_s == pytest.approx(before["forward"].compute_s / 0.5)
    assert after["backward"].compute_s == pytest.approx(before["backward"].compute_s / 0.25)
    assert after["forward"].gemms[0].kernel_rate == 0.5


def test_sdpas_own_pick_and_grouped_query_configurations_have_their_own_keys():
    spec = get_gpu("h200")
    gqa = AttentionConfig("default", 64, causal=True, gqa=True)
    assert gqa.key(False) == "default/fwd/causal/gqa/d64"
    assert "grouped-query" in gqa.describe
    # the model time of a grouped call: the query's heads do the work, K and V have a quarter
    b, h, t = 2, 8, 128
    grouped = probe_attention.model_s(spec, gqa, (b, h, t), torch.bfloat16)
    plain = probe_attention.model_s(
        spec, AttentionConfig("default", 64, causal=True), (b, h, t), torch.bfloat16
    )
    assert grouped[2] == plain[2] and grouped[3] == plain[3]  # the same FLOPs
    rows = probe_attention.measure_attention(spec, device="cpu", shape=(1, 4, 16), configs=(gqa,))
    row = rows["default/causal/gqa/d64"]
    assert 0.01 <= row["default/fwd/causal/gqa/d64"] <= 1.0
    assert "kernels" not in row  # the CPU names none; on CUDA the row lists what ran
    assert {c.backend for c in probe_attention.CONFIGS} == {
        "flash",
        "efficient",
        "default",
        "cudnn_masked",
    }


def test_a_masked_call_gets_the_rates_the_audit_prices_a_materialized_mask_with():
    """The masked configurations give SDPA an all-true mask and key their rates as the cost
    model looks them up for cuDNN's kernel given a mask; their model time is that kernel's
    compute time over every score (what the rate scales), as materialized-attention-mask
    prices it."""
    from gpushape.auditing.pricing.attention import AttentionShape, fused_records
    from gpushape.tracing.cost import op_cost

    masked = [c for c in probe_attention.CONFIGS if c.backend == probe_attention.MASKED]
    assert {c.key(True) for c in masked} == {"cudnn_masked/bwd/d64", "cudnn_masked/bwd/dropout/d64"}
    spec = get_gpu("h200")
    b, h, t = 2, 4, 256
    cfg = AttentionConfig("cudnn_masked", 64, dropout=0.1)
    fwd_s, bwd_s, fwd_flops, _ = probe_attention.model_s(spec, cfg, (b, h, t), torch.bfloat16)
    call = AttentionShape(bh=b * h, tq=t, tk=t, d=64, dv=64, dtype="bfloat16", has_mask=True,
                          dropout=True)  # fmt: skip
    flat = spec.replace(achievable=__import__("dataclasses").replace(spec.achievable, attention={}))
    priced = [op_cost(r, flat) for r in fused_records(call, True, "cudnn")]
    assert (fwd_s, bwd_s) == pytest.approx((priced[0].compute_s, priced[1].compute_s))
    assert fwd_flops == 4 * b * h * t * t * 64  # every score: no causal half
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(probe_attention.F, "scaled_dot_product_attention", spy)
    try:
        rows = probe_attention.measure_attention(spec, device="cpu", shape=SHAPE, configs=(cfg,))
    finally:
        mp.undo()
    row = rows["cudnn_masked/dropout/d64"]
    assert 0.01 <= row["cudnn_masked/fwd/dropout/d64"] <= 1.0
    assert "mask" in row["workload"]
    ran = [m for m in seen if m is None or m.device.type != "meta"]  # not the model's trace
    assert ran and all(m is not None and m.dtype == torch.bool and bool(m.all()) for m in ran)
    assert all(m.shape == (1, 2, 16, 16) and m.stride(1) == 0 for m in ran)  # (B, 1, T, T) expanded


def test_a_rate_measured_at_several_lengths_is_taken_at_the_calls_length():
    """The probe measures some configurations at short sequences too ("@t256"); a call
    between two measured lengths takes the rate interpolated in log2 of its length, one
    outside them the nearest, and a call of a configuration measured at one length that one."""
    from gpushape.hardware.spec import ATTENTION_PROBE_SEQ, Achievable

    assert probe_attention.CONFIGS and {c.key(False) for c in probe_attention.CONFIGS if c.seq} >= {
        "default/fwd/d64@t256"
    }
    assert probe_plan.full_plan().attention_shape[2] == ATTENTION_PROBE_SEQ
    assert probe_plan.quick_plan().attention_shape[2] == ATTENTION_PROBE_SEQ
    rates = Achievable(
        attention={
            "default/fwd/d64": 0.8,
            "default/fwd/d64@t256": 0.4,
            "default/bwd/d64": 0.6,
        }
    )
    rate = lambda seq: rates.attention_rate("default", False, False, False, 64, seq=seq)
    assert rate(1024) == pytest.approx(0.8) and rate(4096) == pytest.approx(0.8)
    assert rate(256) == pytest.approx(0.4) and rate(197) == pytest.approx(0.4)
    assert rate(512) == pytest.approx(0.6)  # halfway in log2 between 256 and 1024
    assert rate(0) == pytest.approx(0.8)  # no length: the probe's own
    assert rates.attention_rate("default", True, False, False, 64, seq=197) == 0.6


def test_a_short_configuration_keeps_the_probes_tokens():
    cfg = AttentionConfig("default", 64, seq=256)
    assert cfg.shape((8, 16, 1024)) == (32, 16, 256)
    assert cfg.key(True) == "default/bwd/d64@t256" and "sequences of 256" in cfg.describe
    assert AttentionConfig("default", 64).shape((8, 16, 1024)) == (8, 16, 1024)
    rows = probe_attention.measure_attention(
        get_gpu("h200"),
        device="cpu",
        shape=(1, 2, 16),
        configs=(AttentionConfig("default", 64, seq=32),),
    )
    assert "default/fwd/d64@t32" in rows["default/d64@t32"]
    assert "32" in rows["default/d64@t32"]["workload"]
