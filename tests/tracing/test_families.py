"""Memory families (trace/families.py) and how the cost model prices them: an op's memory time
is its bytes at the copy rate divided by its family's measured efficiency."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, trace_fn

from gpushape.hardware import get_gpu
from gpushape.hardware.profile import calibrated
from gpushape.tracing.cost import op_cost
from gpushape.tracing.families import (
    ALL_FAMILIES,
    FAMILIES,
    memory_family,
    op_family,
    priced_family,
)


def _family_of(fn, *shapes, name: str, train: bool = True) -> str | None:
    inputs = tuple(meta(*s, requires_grad=True) for s in shapes)
    return memory_family(only(trace_fn(fn, inputs, train=train), name))


@pytest.mark.parametrize(
    ("fn", "shapes", "name", "family"),
    [
        (lambda x: F.layer_norm(x, (64,)), [(8, 64)], "native_layer_norm", "norm"),
        (lambda x: F.layer_norm(x, (64,)), [(8, 64)], "native_layer_norm_backward", "norm"),
        (lambda x: torch.softmax(x, -1), [(8, 64)], "_softmax", "softmax"),
        (lambda x: F.max_pool2d(x, 2), [(2, 3, 8, 8)], "max_pool2d_with_indices", "pool_nchw"),
        (
            lambda x: F.avg_pool2d(x, 3, 1, 1),
            [(2, 3, 8, 8)],
            "avg_pool2d_backward",
            "avg_pool_nchw",
        ),
        (
            lambda x: F.avg_pool2d(x.contiguous(memory_format=torch.channels_last), 3, 1, 1),
            [(2, 3, 8, 8)],
            "avg_pool2d",
            "avg_pool",
        ),
        (
            lambda x: F.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2),
            [(2, 3, 8, 8)],
            "max_pool2d_with_indices",
            "pool",
        ),
        (
            lambda x: F.batch_norm(x, None, None, training=True),
            [(2, 3, 8, 8)],
            "native_batch_norm_backward",
            "batch_norm_nchw",
        ),
        (
            lambda x: F.batch_norm(x, None, None, training=True),
            [(2, 3, 8)],
            "native_batch_norm",
            "batch_norm",
        ),  # BatchNorm1d: no layouts to tell apart
        (lambda x: F.gelu(x), [(8, 64)], "gelu_backward", "activation"),
        (lambda x, y: torch.relu(x + y), [(8, 64), (8, 64)], "add", "elementwise"),
        (lambda x: x.sum(0), [(8, 64)], "sum", "reduction"),
    ],
)
def test_ops_fall_in_their_family(fn, shapes, name, family):
    assert _family_of(fn, *shapes, name=name) == family


def test_an_op_of_no_family_keeps_the_copy_rate():
    rec = only(trace_fn(lambda x: x.to(torch.bfloat16), (meta(64, 64),)), "_to_copy")
    assert memory_family(rec) is None
    spec = get_gpu("h200")
    slow = spec.replace(
        achievable=dataclasses.replace(
            spec.achievable, memory_efficiency={f: 0.1 for f in ALL_FAMILIES}
        )
    )
    assert op_cost(rec, slow).memory_s == op_cost(rec, spec).memory_s


def test_memory_time_divides_by_the_family_efficiency():
    rec = only(
        trace_fn(lambda x: F.layer_norm(x, (4096,)), (meta(4096, 4096),)), "native_layer_norm"
    )
    spec = get_gpu("h200")
    half = spec.replace(
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={"norm": 0.5})
    )
    assert op_cost(rec, half).memory_s == pytest.approx(2 * op_cost(rec, spec).memory_s)
    other = spec.replace(
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={"softmax": 0.5})
    )
    assert op_cost(rec, other).memory_s == op_cost(rec, spec).memory_s


def test_the_shipped_h200_profile_carries_measured_efficiencies():
    eff = calibrated("h200").achievable.memory_efficiency
    grid = {f for f in eff if "x" in f.partition("@")[2]}  # "<family>@<rows>x<channels>"
    assert set(eff) - grid <= set(ALL_FAMILIES)
    assert {f.partition("@")[0] for f in grid} <= set(ALL_FAMILIES)
    assert {"norm", "batch_norm", "pool", "elementwise", "fused_norm_act"} <= set(eff)
    # norm_weight_grad is against one SM's share of the copy rate: an SM may draw more (to 4)
    assert all(0 < v <= (4 if f == "norm_weight_grad" else 1) for f, v in eff.items())
    assert get_gpu("h200").achievable.memory("norm") == 1.0  # the datasheet spec: copy rate


def test_family_tables_do_not_overlap():
    ops = [op for family in FAMILIES.values() for op in family]
    assert len(ops) == len(set(ops))


def test_an_unmeasured_average_pool_is_priced_as_the_max_pool_in_its_layout():
    """Profiles measured before avg_pool had a family price it as they did (the pool family of
    its layout); one that measured it, at its own."""
    pools = {"pool": 0.21, "pool_nchw": 0.19}
    assert priced_family("avg_pool_nchw", pools) == "pool_nchw"
    assert priced_family("avg_pool", pools) == "pool"
    assert priced_family("avg_pool_nchw", {**pools, "avg_pool_nchw": 0.06}) == "avg_pool_nchw"
    assert priced_family("avg_pool_nchw", {**pools, "avg_pool": 0.1}) == "pool_nchw"


def test_group_norm_has_its_own_family_priced_as_before_until_measured():
    """GroupNorm's kernels (one block per sample and group) are not a row norm's: a family of
    their own; a profile without it prices them as it did, at the row norm measured nearest the
    tensor's last dimension; one with it, at its own."""
    recs = trace_fn(
        lambda x: F.group_norm(x, 1), (meta(8, 64, 56, 56, requires_grad=True),), train=True
    )
    fwd, bwd = only(recs, "native_group_norm"), only(recs, "native_group_norm_backward")
    assert memory_family(fwd) == memory_family(bwd) == "group_norm"
    norms = {"norm": 0.5, "norm@96": 0.3, "norm@768": 0.4}
    assert op_family(fwd, norms) == "norm@96"  # W = 56: what it was priced as before
    assert op_family(bwd, {**norms, "group_norm": 0.13}) == "group_norm"
    assert priced_family("group_norm", {}) == "norm"
    # by samples x groups, the thread blocks its statistics take: 8 x 1 nearest the base's 64,
    # 64 x 32 (ResNet-50-GN's) at the 2048 measured
    both = {**norms, "group_norm": 0.13, "group_norm@2048": 0.2}
    assert op_family(fwd, both) == "group_norm"
    recs = trace_fn(lambda x: F.group_norm(x, 32), (meta(64, 64, 14, 14),))
    assert op_family(only(recs, "native_group_norm"), both) == "group_norm@2048"


def test_an_unmeasured_nchw_family_is_priced_as_its_channels_last_one():
    """A profile without the NCHW figure prices NCHW BatchNorm at the batch_norm family's (the
    chips measured before the split), one with it at its own."""
    rec = only(
        trace_fn(lambda x: F.batch_norm(x, None, None, training=True), (meta(8, 64, 16, 16),)),
        "native_batch_norm",
    )
    assert memory_family(rec) == "batch_norm_nchw"
    assert priced_family("batch_norm_nchw", {"batch_norm": 0.5}) == "batch_norm"
    assert priced_family("batch_norm_nchw", {"batch_norm_nchw": 0.2}) == "batch_norm_nchw"
    assert priced_family("norm", {}) == "norm" and priced_family(None, {}) is None
    spec = get_gpu("h200")  # no kernel floor: the rates alone
    spec = spec.replace(achievable=dataclasses.replace(spec.achievable, kernel_floor_s=0.0))

    def with_eff(**eff):
        return spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency=eff))

    base = op_cost(rec, spec).memory_s
    assert op_cost(rec, with_eff(batch_norm=0.5)).memory_s == pytest.approx(2 * base)
    assert op_cost(rec, with_eff(batch_norm=0.5, batch_norm_nchw=0.25)).memory_s == pytest.approx(
        4 * base
    )


def test_norms_are_priced_at_the_measured_row_length_nearest_theirs():
    measured = {"norm": 0.4, "norm@768": 0.2, "norm@384": 0.1}
    assert priced_family("norm", measured, 768) == "norm@768"
    assert priced_family("norm", measured, 1024) == "norm@768"  # 1024/768 < 4096/1024
    assert priced_family("norm", measured, 2560) == "norm"
    assert priced_family("norm", measured, 256) == "norm@384"
    assert priced_family("norm", {"norm": 0.4}, 768) == "norm"  # only the base measured
    assert priced_family("norm", {}, 768) == "norm"  # nothing measured: the copy rate
    assert priced_family("softmax", measured, 512) == "softmax"


def test_a_short_rows_measurement_prices_bert_width_layer_norms():
    from torch import nn

    import gpushape

    # over 64 x 1024 rows: the weight gradients stream at the norm's rate too (split path)
    x = torch.empty(131072, 768, device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(nn.LayerNorm(768).to("meta", torch.bfloat16), (x,), train=True)
    spec = get_gpu("h200")
    base = dataclasses.replace(spec.achievable, memory_efficiency={"norm": 0.4})
    rows = dataclasses.replace(base, memory_efficiency={"norm": 0.4, "norm@768": 0.2})
    at_4096 = gpushape.cost(trace, spec.replace(achievable=base)).totals.kernel_time_s
    at_768 = gpushape.cost(trace, spec.replace(achievable=rows)).totals.kernel_time_s
    assert at_768 == pytest.approx(2 * at_4096, rel=0.05)


def test_gpushapes_group_norm_ops_are_priced_as_the_fused_group_norm():
    """GroupNormAct's custom ops (forward and backward) in a trace: the family its probe
    workload measures, as every gpushape kernel's."""
    import gpushape
    from gpushape.kernels import GroupNormAct

    assert "fused_group_norm" in ALL_FAMILIES
    with torch.device("meta"):
        model = GroupNormAct(4, 8, activation="relu").to(torch.bfloat16)
    x = meta(2, 8, 4, 4, dtype=torch.bfloat16, requires_grad=True)
    ops = [r for r in gpushape.trace(model, (x,), train=True).ops if "group_norm_act" in r.op]
    assert sorted(r.op.rsplit(".", 1)[0] for r in ops) == [
        "gpushape.group_norm_act",
        "gpushape.group_norm_act_backward",
    ]
    assert {memory_family(r) for r in ops} == {"fused_group_norm"}
