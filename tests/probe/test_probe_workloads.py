"""The probe's workloads for families measured by size, layout or pass (probe/workloads/):
each exists for every key the cost model reads, its traced ops are the family at the size its
key names, the sizes of one family move the same bytes, and the forward-only and patch
convolution workloads measure what they say."""

from __future__ import annotations

import math

import pytest
import torch

from gpushape.hardware import get_gpu
from gpushape.probe import memory as probe_memory
from gpushape.probe.convs import conversion_key, conversion_row
from gpushape.probe.workloads import WORKLOADS
from gpushape.tracing.cost import op_cost
from gpushape.tracing.families import (
    ALL_FAMILIES,
    PATCH_VARIANTS,
    SIZE_VARIANTS,
    memory_family,
    variant_size,
)
from gpushape.tracing.norm_grads import weight_grad_pass
from gpushape.tracing.sums import sum_shape
from gpushape.tracing.tracer import trace

NEW = (
    *SIZE_VARIANTS,
    *PATCH_VARIANTS,
    "gather",
    "scatter_add",
    "permuted_copy",
    "permuted_cat",
    "permuted_stack",
    "transposed_copy",
    "transposed_copy_nchw",
    "avg_pool",
    "avg_pool_nchw",
    "group_norm",
    "roll",
    "grouped_conv_nchw",
    "elementwise_strided",
    "gemm",
    "norm_weight_grad",
    "downsample_conv@2",
    "s2d_stem",
    "s2d_stem@2",
    "s2d_fold",
)
BY_FAMILY = {w.family: w for w in WORKLOADS}


GRID = {f for f in BY_FAMILY if "x" in f.partition("@")[2]}  # "<family>@<rows>x<channels>"


def test_every_key_the_cost_model_reads_has_a_workload():
    assert set(NEW) <= set(BY_FAMILY)
    assert set(BY_FAMILY) - GRID <= set(ALL_FAMILIES)
    assert {f.partition("@")[0] for f in GRID} == {"reduction", "channel_sum"}


@pytest.mark.parametrize("family", sorted(GRID))
def test_a_grid_workload_sums_the_rows_and_channels_its_key_names(family):
    base, _, size = family.partition("@")
    rows, _, channels = size.partition("x")
    with torch.device("meta"):  # full size, no memory
        model = BY_FAMILY[family].build(1.0).to(torch.bfloat16)
    ops = [r for r in trace(model, (), train=False).ops if r.kind == "compute"]
    assert [sum_shape(r) for r in ops] == [(base, int(rows), int(channels))]


def _family_ops(family: str, scale: float = 0.002):
    work = BY_FAMILY[family]
    model = work.build(scale).to(torch.bfloat16)
    ops = trace(model, (), train=work.train).ops
    return [r for r in ops if memory_family(r) == family.partition("@")[0]]


@pytest.mark.parametrize("family", [f for f in SIZE_VARIANTS if f in BY_FAMILY])
def test_a_sized_workload_runs_its_family_at_the_size_its_key_names(family):
    with torch.device("meta"):  # full size (GroupNorm's size counts the samples), no memory
        model = BY_FAMILY[family].build(1.0).to(torch.bfloat16)
    ops = [r for r in trace(model, ()).ops if memory_family(r) == family.partition("@")[0]]
    base = family.partition("@")[0]
    assert ops and all(variant_size(r, base) == int(family.partition("@")[2]) for r in ops)


def _elements(family: str) -> int:
    with torch.device("meta"):  # full size, no memory
        model = BY_FAMILY[family].build(1.0)
    return sum(p.numel() for p in model.parameters() if p.dim() > 1)


@pytest.mark.parametrize("base", ["norm", "batch_norm_nchw"])
def test_one_familys_sizes_move_the_same_bytes(base):
    sizes = [f for f in BY_FAMILY if f == base or f.startswith(base + "@")]
    counts = [_elements(f) for f in sizes]
    assert len(sizes) >= 3
    assert max(counts) <= 1.01 * min(counts), dict(zip(sizes, counts))


def test_the_gather_is_timed_forward_only_and_the_scatter_with_its_forward():
    gather = _family_ops("gather")
    assert gather and all(r.phase == "forward" for r in gather)
    assert not BY_FAMILY["gather"].train
    scatter = _family_ops("scatter_add")
    assert [r.name for r in scatter] == ["embedding_dense_backward"]


@pytest.mark.parametrize(
    ("family", "ops"), [("permuted_copy", 2), ("transposed_copy", 1), ("transposed_copy_nchw", 1)]
)
def test_the_copy_workloads_copy_between_layouts(family, ops):
    assert len(_family_ops(family)) == ops


def test_the_roll_workload_rolls_two_dimensions_forward_and_backward():
    rolls = _family_ops("roll")
    assert len(rolls) == 2 and all(len(r.params["dims"]) == 2 for r in rolls)


@pytest.mark.parametrize("family", PATCH_VARIANTS)
def test_a_patch_convolution_is_its_step_against_the_gemm_model(family):
    row = probe_memory.measure_memory_efficiency(
        get_gpu("h200"), device="cpu", scale=0.002, families=(family,)
    )[family]
    assert row["model_s"] > 0 and row["measured_s"] > 0 and row["nchw_measured_s"] > 0
    assert row["family_roofline_s"] == row["model_s"]
    raw = row["model_s"] / row["measured_s"]
    assert row["efficiency"] == pytest.approx(min(max(raw, 0.01), 1.0), abs=1e-4)
    side = int(family.partition("@")[2])
    conv = BY_FAMILY[family].build(1.0)
    assert conv.kernel_size == (side, side) and conv.stride == (side, side)
    assert conv.in_channels == 3 and not math.prod(conv.padding)


def test_a_patch_convolution_timed_in_both_layouts_gives_its_conversions_rate():
    spec = get_gpu("h200")
    conv = BY_FAMILY["patch_conv@16"].build(1.0)
    row = {"measured_s": 1e-4, "nchw_measured_s": 3e-4, "workload": "w channels_last, f"}
    made = conversion_row(row, conv, 64, 224, spec)
    x, y = 64 * 3 * 224 * 224 * 2, 64 * 768 * 14 * 14 * 2
    assert made["conversion_bytes"] == 4 * (x + y)  # in and out, forward and weight gradient
    rate_s = made["conversion_bytes"] / spec.attainable_bandwidth_bytes_per_s()
    assert made["efficiency"] == pytest.approx(rate_s / 2e-4, abs=1e-4)
    assert conversion_row({**row, "nchw_measured_s": 1e-4}, conv, 64, 224, spec) is None
    rows = probe_memory.measure_memory_efficiency(
        spec, device="cpu", scale=0.002, families=("patch_conv@4",)
    )
    assert "derived" not in rows["patch_conv@4"]  # its conversions' row, if any, stands alone
    assert set(rows) <= {"patch_conv@4", "nchw_conversion@4"}


def test_a_stem_at_stride_4_is_measured_against_the_gemm_models_rate():
    spec = get_gpu("h200")
    conv = BY_FAMILY["small_cin_conv@4"].build(1.0)
    assert (conv.in_channels, conv.kernel_size, conv.stride) == (3, (7, 7), (4, 4))
    rows = probe_memory.measure_memory_efficiency(
        spec, device="cpu", scale=0.002, families=("small_cin_conv@4",)
    )
    row = rows["small_cin_conv@4"]
    assert "derived" not in row  # its conversions' row, if any, stands alone
    assert set(rows) <= {"small_cin_conv@4", "nchw_conversion_stem@4"}
    assert 0.01 <= row["efficiency"] <= 1 and row["model_s"] > 0 and row["measured_s"] > 0
    assert row["nchw_measured_s"] > 0


def test_a_stems_conversions_are_its_nchw_step_against_its_channels_last_one():
    spec = get_gpu("h200")
    conv = BY_FAMILY["nchw_conversion_stem"].build(1.0)
    assert (conv.in_channels, conv.kernel_size, conv.stride) == (3, (7, 7), (2, 2))
    row = {"measured_s": 1e-4, "nchw_measured_s": 5e-4, "workload": "w channels_last, f"}
    made = conversion_row(row, conv, 64, 224, spec)
    x, y = 64 * 3 * 224 * 224 * 2, 64 * 64 * 112 * 112 * 2  # (224 + 6 - 7) // 2 + 1 = 112
    assert made["conversion_bytes"] == 4 * (x + y)
    rate_s = made["conversion_bytes"] / spec.attainable_bandwidth_bytes_per_s()
    assert made["efficiency"] == pytest.approx(rate_s / 4e-4, abs=1e-4)
    assert conversion_key(conv) == "nchw_conversion_stem"
    assert conversion_key(BY_FAMILY["small_cin_conv@4"].build(1.0)) == "nchw_conversion_stem@4"
    assert conversion_key(BY_FAMILY["patch_conv@16"].build(1.0)) == "nchw_conversion@16"
    rows = probe_memory.measure_memory_efficiency(
        spec, device="cpu", scale=0.002, families=("nchw_conversion_stem",)
    )
    assert set(rows) == {"nchw_conversion_stem"}
    assert 0.01 <= rows["nchw_conversion_stem"]["efficiency"] <= 1


def test_the_strided_workload_multiplies_by_a_broadcast_mask_forward_and_backward():
    ops = _family_ops("elementwise_strided")
    assert [r.phase for r in ops] == ["forward", "backward"]


def test_the_gemm_workload_is_six_memory_bound_products_on_the_h200():
    work = BY_FAMILY["gemm"]
    with torch.device("meta"):
        model = work.build(1.0).to(torch.bfloat16)
    gemms = [r for r in trace(model, (), train=True).ops if memory_family(r) == "gemm"]
    costs = [op_cost(r, get_gpu("h200")) for r in gemms]
    assert len(costs) == 6 and all(c.memory_s > c.compute_s for c in costs)


def test_the_weight_gradient_workload_runs_the_columns_kernel_alone():
    with torch.device("meta"):
        model = BY_FAMILY["norm_weight_grad"].build(1.0)
    (rec,) = [r for r in trace(model, (), train=False).ops if r.kind == "compute"]
    grads = weight_grad_pass(rec, get_gpu("h200").sm_count)
    assert rec.params["output_mask"] == (False, True, True)
    assert (grads.rows, grads.cols, grads.split) == (50176, 192, False)
    row = probe_memory.measure_memory_efficiency(
        get_gpu("h200"), device="cpu", scale=0.002, families=("norm_weight_grad",)
    )["norm_weight_grad"]
    assert row["family_roofline_s"] > 0 and 0.01 <= row["efficiency"] <= 4


def test_the_downsampling_convolution_runs_both_gradients_against_the_gemm_model():
    row = probe_memory.measure_memory_efficiency(
        get_gpu("h200"), device="cpu", scale=0.002, families=("downsample_conv@2",)
    )["downsample_conv@2"]
    assert row["model_s"] > 0 and row["family_roofline_s"] == row["model_s"]
    with torch.device("meta"):
        model = BY_FAMILY["downsample_conv@2"].build(1.0).to(torch.bfloat16)
    (bwd,) = [r for r in trace(model, (), train=True).ops if r.name == "convolution_backward"]
    assert bwd.params["output_mask"][:2] == (True, True)  # input and weight gradients


def test_the_timed_step_makes_its_output_gradient_once(monkeypatch):
    """The traced step has no fill kernel for the gradient of its output; the timed one must
    not make one each call (probe/memory.py `_step`)."""
    made = []
    ones_like = torch.ones_like
    monkeypatch.setattr(torch, "ones_like", lambda t: made.append(t.shape) or ones_like(t))
    step = probe_memory._step(BY_FAMILY["activation"].build(0.002))
    for _ in range(3):
        step()
    assert len(made) == 1


def test_the_qkv_stack_workload_is_one_permuted_stack_forward():
    """permuted_stack's workload is what unbind's backward runs in timm's attention: one stack
    of three permuted views, forward only, and nothing else the family would price."""
    ops = _family_ops("permuted_stack")
    assert len(ops) == 1 and ops[0].phase == "forward" and not BY_FAMILY["permuted_stack"].train
    assert "aten.stack" in ops[0].op and len(ops[0].inputs) == 3


def test_the_cache_append_workload_is_one_permuted_cat_forward():
    """permuted_cat's workload is what GPT-2's key/value cache runs: one cat of a permuted
    view onto an empty tensor, forward only, and nothing else the family would price."""
    ops = _family_ops("permuted_cat")
    assert len(ops) == 1 and ops[0].phase == "forward" and not BY_FAMILY["permuted_cat"].train
    assert "aten.cat" in ops[0].op
