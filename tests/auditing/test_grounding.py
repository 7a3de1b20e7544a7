"""Rules read the chip from the GPUSpec: launch overheads, bandwidth, memory size. Change the
spec and the estimate follows; the H200 anchor for channels_last bounds nchw-conv."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpushape.auditing import audit
from gpushape.hardware import get_gpu
from gpushape.models import create_model

from .cases import build, meta
from .models import ManyTiny


def test_launch_bound_saving_is_launches_times_eager_minus_graph_overhead():
    """Fully launch-bound (40 tiny layers, GEMMs without a kernel latency), the saving is
    kernels x (eager - graph). With the latency, the graph's replay waits on the GPU's tiny
    GEMMs (4 us each): the saving is the eager host less the GPU's time."""
    from gpushape.auditing.modes import host_spread, wall_clock_s

    h200 = get_gpu("h200")
    a = dataclasses.replace(h200.achievable, gemm_latency_s=0.0, kernel_floor_s=0.0)
    model, inputs = build(ManyTiny), (meta(16, 64),)
    (f,) = audit(
        model, inputs, gpu=h200.replace(achievable=a), profile=None, rules=["launch-bound"]
    ).findings
    assert f.est_saving_s == pytest.approx(
        f.evidence["kernels"] * (a.launch_overhead_s - a.graph_launch_overhead_s)
    )
    (real,) = audit(model, inputs, gpu=h200, profile=None, rules=["launch-bound"]).findings
    gpu_s, host_s = real.evidence["gpu_time_s"], real.evidence["eager_host_time_s"]
    assert real.evidence["graph_launch_time_s"] < gpu_s < host_s
    spread = host_spread(h200)
    assert real.est_saving_s == pytest.approx(
        wall_clock_s(gpu_s, host_s, spread)
        - wall_clock_s(gpu_s, real.evidence["graph_launch_time_s"], spread)
    )
    slower = h200.replace(
        achievable=dataclasses.replace(a, launch_overhead_s=2 * a.launch_overhead_s)
    )
    (g,) = audit(model, inputs, gpu=slower, profile=None, rules=["launch-bound"]).findings
    assert g.est_saving_s > f.est_saving_s
    assert g.evidence["launch_overhead_s"] == 2 * a.launch_overhead_s


def test_byte_savings_follow_the_chips_bandwidth():
    """unfused-norm-act prices bytes at the spec's attainable bandwidth. (Over 64 x 1024 rows:
    below that PyTorch sums a LayerNorm's weight gradients one SM per 32 columns, a time that
    follows an SM's share of the bandwidth: tracing/norm_grads.py.)"""
    from .models import NormThen

    model, inputs = build(NormThen), (meta(136, 512, 1024),)
    a100, h200 = get_gpu("a100"), get_gpu("h200")
    (fa,) = audit(model, inputs, gpu=a100, profile=None, rules=["unfused-norm-act"]).findings
    (fh,) = audit(model, inputs, gpu=h200, profile=None, rules=["unfused-norm-act"]).findings
    assert fa.evidence["bytes_saved"] == fh.evidence["bytes_saved"] > 0
    ratio = fa.est_saving_s / fh.est_saving_s
    expected = h200.attainable_bandwidth_bytes_per_s() / a100.attainable_bandwidth_bytes_per_s()
    assert ratio == pytest.approx(expected)


def test_nchw_conv_against_the_h200_channels_last_anchor():
    """H200, torch 2.11, ResNet-50 training in bf16 at batch 256
    (benchmarks/results/baselines-h200/h200-2026-11-30.json, resnet50_train_bf16): NCHW
    2403.5 img/s, channels_last 4654.0 img/s, i.e. 106.5 and 55.0 ms a step: channels_last
    saved 48 % of the NCHW step.

    With the shipped profile the cost model prices the NCHW step's layout conversions and its
    BatchNorm and pooling at their NCHW rates; the rule's saving is both. Compared: the NCHW
    step (~97 ms at the time of writing) and the share of it the saving takes (~0.37). The
    bounds keep both within a factor of 1.6 of the measurement. On the datasheet spec (no
    profile, so no NCHW BatchNorm figure) only the conversions are priced, ~0.29 of the step:
    still the right size."""
    measured_share, measured_step_s = 1 - 2403.5 / 4654.0, 256 / 2403.5
    model, inputs = create_model("resnet50", batch=256)
    h200 = get_gpu("h200")
    report = audit(model, inputs, gpu=h200, train=True, rules=["nchw-conv"])
    (f,) = report.findings
    step_s = report.totals.roofline_time_s
    assert measured_step_s / 1.6 <= step_s <= measured_step_s * 1.6
    assert measured_share / 1.6 <= f.est_saving_s / step_s <= measured_share * 1.6
    assert f.evidence["nchw_norm_pool_s"] > 0 and f.evidence["conversions_s"] > 0
    sheet = audit(model, inputs, gpu=h200, profile=None, train=True, rules=["nchw-conv"])
    (g,) = sheet.findings
    assert measured_share / 2 <= g.est_saving_s / sheet.totals.roofline_time_s < measured_share
    assert g.evidence["nchw_norm_pool_s"] == 0


def test_nchw_conv_divides_the_conversions_by_their_measured_efficiency():
    """A profile's "nchw_conversion" efficiency (probe/convs.py) scales the saving: at
    0.4 of the copy rate the conversions take 2.5x as long as at the copy rate."""
    import dataclasses

    from .models import ConvBN

    h200 = get_gpu("h200")
    model, inputs = build(ConvBN), (meta(32, 64, 56, 56),)
    (f,) = audit(model, inputs, gpu=h200, profile=None, rules=["nchw-conv"]).findings
    measured = h200.replace(
        achievable=dataclasses.replace(h200.achievable, memory_efficiency={"nchw_conversion": 0.4})
    )
    (g,) = audit(model, inputs, gpu=measured, profile=None, rules=["nchw-conv"]).findings
    assert f.evidence["conversion_efficiency"] == 1.0
    assert g.evidence["conversion_efficiency"] == 0.4
    assert g.est_saving_s == pytest.approx(f.est_saving_s / 0.4)
    assert g.evidence["conversion_bytes"] == f.evidence["conversion_bytes"]


def test_nchw_conv_adds_what_nchw_batch_norm_loses_to_channels_last():
    """With NCHW BatchNorm measured at a third of channels_last BatchNorm's efficiency, the
    saving adds two thirds of the NCHW BatchNorm ops' memory time (forward and backward)."""
    import dataclasses

    import gpushape
    from gpushape.tracing.cost import op_cost
    from gpushape.tracing.families import memory_family

    from .models import ConvBN

    h200 = get_gpu("h200")
    model, inputs = build(ConvBN), (meta(32, 64, 56, 56),)
    (plain,) = audit(model, inputs, gpu=h200, profile=None, rules=["nchw-conv"]).findings
    spec = h200.replace(
        achievable=dataclasses.replace(
            h200.achievable, memory_efficiency={"batch_norm": 0.6, "batch_norm_nchw": 0.2}
        )
    )
    report = audit(model, inputs, gpu=spec, profile=None, rules=["nchw-conv"])
    (f,) = report.findings
    traced = gpushape.trace(model, inputs, train=True)
    bn = [r for r in traced.ops if memory_family(r) == "batch_norm_nchw"]
    assert len(bn) == 2 == f.evidence["nchw_norm_pool_ops"]  # forward and backward
    extra = sum(op_cost(r, spec).memory_s for r in bn) * (1 - 0.2 / 0.6)
    assert f.evidence["nchw_norm_pool_s"] == pytest.approx(extra)
    assert f.est_saving_s == pytest.approx(plain.est_saving_s + extra)
    assert "BatchNorm/pooling" in f.message and "BatchNorm/pooling" not in plain.message


def test_checkpointing_is_only_advised_when_memory_is_short():
    """The same stack draws checkpoint-candidate on a 24 GB chip and nothing on a 141 GB one
    at a batch whose activations (~26 GB) fit the latter easily but not the former."""
    from .models import MLPStack

    model, inputs = build(MLPStack, width=2048, depth=8), (meta(262144, 2048),)
    small = audit(model, inputs, gpu="l4", rules=["checkpoint-candidate"]).findings
    large = audit(model, inputs, gpu="h200", rules=["checkpoint-candidate"]).findings
    assert small and not large
    assert small[0].evidence["gpu_memory_bytes"] == get_gpu("l4").memory_bytes


def test_fp32_math_quiet_when_the_chip_runs_tf32_convolutions_by_default():
    """fp32 convolutions take TF32 tensor cores under cuDNN's default flags: no finding;
    with TF32 off for convolutions too, they run on CUDA cores: a finding."""
    from gpushape.auditing.context import BackendFlags

    from .models import ConvBN

    model, inputs = ConvBN(), (meta(8, 64, 56, 56, dtype=torch.float32),)
    quiet = audit(
        model,
        inputs,
        dtype=torch.float32,
        rules=["fp32-math"],
        flags=BackendFlags(matmul_tf32=False, cudnn_tf32=True),
    ).findings
    loud = audit(
        model,
        inputs,
        dtype=torch.float32,
        rules=["fp32-math"],
        flags=BackendFlags(matmul_tf32=False, cudnn_tf32=False),
    ).findings
    assert quiet == [] and loud and loud[0].module == "conv"


def test_launch_savings_count_only_when_the_step_is_launch_bound():
    """Fusing three projections removes launches. In a launch-bound step (a few tokens) that is
    most of the saving; when the GPU's work hides the launches (many tokens) it is none."""
    from .models import Attention

    h100 = get_gpu("h100")
    launch = h100.achievable.launch_overhead_s
    model = build(Attention, fused_qkv=False)
    (tiny,) = audit(model, (meta(1, 8, 768),), gpu=h100, rules=["separate-qkv"]).findings
    fewer = tiny.evidence["time_separate_s"] - tiny.evidence["time_fused_s"]
    assert fewer >= 8 * launch  # 3 x 4 kernels + 2 gradient sums against 4 kernels
    a = h100.achievable
    slower = h100.replace(
        achievable=type(a)(
            launch_overhead_s=2 * a.launch_overhead_s,
            graph_launch_overhead_s=a.graph_launch_overhead_s,
        )
    )
    savings = []
    for spec in (h100, slower):
        big = audit(model, (meta(32, 512, 768),), gpu=spec, profile=None, rules=["separate-qkv"])
        assert big.totals.launch_s < big.totals.kernel_time_s  # the GPU sets the pace
        savings.append(big.findings[0].est_saving_s)
    assert savings[0] == pytest.approx(savings[1]) and savings[0] > 0


def test_fusion_savings_follow_the_measured_kernel_efficiencies():
    """unfused-norm-act: slower eager norms save more by fusing, a slower fused kernel less;
    with nothing measured the saving is the removed bytes at the copy rate (over 64 x 1024
    rows, where the LayerNorm's weight gradients stream like its other bytes)."""
    import dataclasses

    from .models import NormThen

    model, inputs = build(NormThen), (meta(136, 512, 1024),)
    h200 = get_gpu("h200")

    def saving(**eff):
        spec = h200.replace(achievable=dataclasses.replace(h200.achievable, memory_efficiency=eff))
        (f,) = audit(model, inputs, gpu=spec, profile=None, rules=["unfused-norm-act"]).findings
        return f.est_saving_s, f.evidence["bytes_saved"]

    flat, nbytes = saving()
    assert flat == pytest.approx(nbytes / h200.attainable_bandwidth_bytes_per_s())
    slow_norm, _ = saving(norm=0.4, activation=0.6)
    assert slow_norm > flat
    assert saving(norm=0.4, activation=0.6, fused_norm_act=0.5)[0] < slow_norm


def test_a_fused_batch_norm_keeps_the_statistics_pass_in_its_bytes():
    """ConvBN's BatchNorm -> ReLU in training: the fused kernel is priced moving the chain's
    bytes (the two-pass BatchNorm's re-reads included) less the removed intermediates; halving
    its efficiency costs exactly that many bytes' time once more."""
    import dataclasses

    from gpushape.tracing.flops.registry import op_work

    from .models import ConvBN

    model, inputs = build(ConvBN), (meta(8, 64, 32, 32, channels_last=True),)
    h200 = get_gpu("h200")

    def finding(fused: float):
        spec = h200.replace(
            achievable=dataclasses.replace(
                h200.achievable, memory_efficiency={"batch_norm": 0.4, "fused_norm_act": fused}
            )
        )
        (f,) = audit(model, inputs, gpu=spec, profile=None, rules=["unfused-norm-act"]).findings
        return f

    full, half = finding(1.0), finding(0.5)
    kept_s = full.est_saving_s - half.est_saving_s  # kept bytes at the copy rate
    ops = _traced_ops(model, inputs)
    assert sum(op_work(r).reread_bytes for r in ops if r.name == "native_batch_norm") > 0
    bw = h200.attainable_bandwidth_bytes_per_s()
    chain = [
        r
        for r in ops
        if r.name
        in ("native_batch_norm", "native_batch_norm_backward", "relu_", "threshold_backward")
    ]
    moved = sum(op_work(r).min_bytes + op_work(r).reread_bytes for r in chain)
    assert kept_s * bw == pytest.approx(moved - full.evidence["bytes_saved"], rel=1e-6)


def test_a_batch_norm_chain_is_priced_at_the_fused_batch_norm_rate_once_measured():
    """BatchNorm -> ReLU: gpushape's BatchNormAct2d rate prices the fix when the profile has it;
    LayerNormGELU's stands in when it does not, and never prices a LayerNorm chain."""
    import dataclasses

    from .models import ConvBN, NormThen

    h200 = get_gpu("h200")

    def saving(model, inputs, **eff):
        spec = h200.replace(achievable=dataclasses.replace(h200.achievable, memory_efficiency=eff))
        (f,) = audit(model, inputs, gpu=spec, profile=None, rules=["unfused-norm-act"]).findings
        return f.est_saving_s

    bn = build(ConvBN), (meta(8, 64, 32, 32, channels_last=True),)
    stand_in = saving(*bn, batch_norm=0.4, fused_norm_act=0.6)
    assert saving(*bn, batch_norm=0.4, fused_norm_act=0.6, fused_batch_norm_act=0.3) < stand_in
    assert saving(
        *bn, batch_norm=0.4, fused_norm_act=0.3, fused_batch_norm_act=0.6
    ) == pytest.approx(stand_in)
    ln = build(NormThen), (meta(8, 512, 1024),)
    assert saving(*ln, norm=0.4, fused_norm_act=0.6) == pytest.approx(
        saving(*ln, norm=0.4, fused_norm_act=0.6, fused_batch_norm_act=0.1)
    )


def _traced_ops(model, inputs):
    import gpushape

    return gpushape.trace(model, inputs, train=True).ops


def test_masked_manual_attention_is_priced_as_the_memory_efficient_kernel():
    """A hand-written attention with a boolean mask (filled where ~mask, as BERT does) is found
    past the mask's own ops; SDPA would take the memory-efficient kernel there, priced at its
    measured rate. Where that kernel is no faster, the finding says the gain is memory only."""
    import dataclasses

    from .models import Attention

    model = build(Attention, manual=True, mask=True, dropout=0.1)
    inputs = (meta(8, 512, 768),)
    h200 = get_gpu("h200")

    def finding(**rates):
        spec = h200.replace(achievable=dataclasses.replace(h200.achievable, attention=rates))
        (f,) = audit(
            model, inputs, gpu=spec, profile=None, train=True, rules=["manual-attention"]
        ).findings
        return f

    fast = finding()
    assert fast.evidence["mask"] and fast.evidence["dropout"]
    assert fast.evidence["fused_kernel"] == "efficient" and fast.est_saving_s > 0
    # a (T, T) mask may be the causal one: flash with is_causal=True is priced beside it
    assert fast.evidence["time_fused_if_causal_s"] < fast.evidence["time_fused_s"]
    assert "if the mask is causal, is_causal=True" in fast.message
    rates = {f"efficient/{p}/dropout/d64": 0.001 for p in ("fwd", "bwd")}
    slow = finding(**rates)
    assert slow.est_saving_s == 0 and slow.evidence["time_fused_s"] > fast.evidence["time_fused_s"]
    assert "no faster for these shapes with a mask and dropout" in slow.message
    assert slow.severity.name == "INFO"


def test_a_key_padding_mask_gets_no_causal_hint():
    """BERT's (B, 1, 1, T) padding mask does not vary over queries: it cannot be the causal one."""
    model, (ids,) = create_model(
        "bert-base", batch=2, seq_len=64, layers=1, attention="manual", dtype=torch.bfloat16
    )
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones(ids.shape, dtype=torch.long, device="meta"),
    }
    (f,) = audit(
        model, inputs, gpu=get_gpu("h200"), train=True, rules=["manual-attention"]
    ).findings
    assert f.evidence["mask"] and f.evidence["fused_kernel"] == "efficient"
    assert "time_fused_if_causal_s" not in f.evidence and "is_causal" not in f.message


def test_separate_qkv_against_fused_qkv_measured_at_llama_7b():
    """H200 (benchmarks/results/kernels-h200/probe_qkv_grads.json, CUDA graphs): one LLaMA-7B
    layer's three 4096-wide projections over 2048 tokens, bf16, forward+backward with the
    gradients SDPA gives, took 0.933 ms as three Linear layers and 0.902 as FusedQKV: 31 us
    saved. The rule prices merging them (shipped profile) within 1.5x of that."""
    from torch import nn

    class Projections(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (
                nn.Linear(4096, 4096, bias=False) for _ in range(3)
            )

        def forward(self, x):
            return self.q_proj(x) + self.k_proj(x) * self.v_proj(x)

    x = meta(1, 2048, 4096).requires_grad_()
    report = audit(
        Projections().to(torch.bfloat16),
        (x,),
        gpu=get_gpu("h200"),
        dtype=torch.bfloat16,
        train=True,
        rules=["separate-qkv"],
    )
    (f,) = report.findings
    assert 31e-6 / 1.5 <= f.est_saving_s <= 31e-6 * 1.5


def test_separate_qkvs_saving_is_what_the_trace_of_the_fused_model_saves():
    """The rule's synthesized records against the step traced before and after `fuse-qkv`:
    the fused side pays the split's backward (a cat of the three output gradients), and bias
    gradients are column sums at their widths' figures, as the trace prices them."""
    import copy

    import gpushape
    from gpushape.hardware.profile import calibrated

    from .models import Attention

    spec = calibrated("h200-sxm")
    model = build(Attention, fused_qkv=False).to(torch.bfloat16)
    # inside a network, the block's input carries a gradient (the three input gradients summed)
    x = (meta(32, 512, 768, dtype=torch.bfloat16).requires_grad_(),)
    (finding,) = audit(model, x, gpu=spec, dtype=torch.bfloat16, rules=["separate-qkv"]).findings
    fused, _ = gpushape.optimize(copy.deepcopy(model), x, gpu=spec, dtype=torch.bfloat16,
                                 transforms=["fuse-qkv"])  # fmt: skip

    def kernel_s(m) -> float:
        return gpushape.cost(gpushape.trace(m, x, train=True), spec).totals.kernel_time_s

    traced = kernel_s(model) - kernel_s(fused)
    e = finding.evidence
    assert e["time_separate_s"] - e["time_fused_s"] == pytest.approx(traced, rel=0.1)
