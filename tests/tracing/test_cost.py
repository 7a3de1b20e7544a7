"""The roofline cost: times from the GPUSpec, bounds, math modes, module aggregation."""

from __future__ import annotations

import pytest
import torch
from _trace_helpers import meta, only, trace_fn
from torch import nn

import gpushape
from gpushape.errors import GpushapeError, UnknownGPUError
from gpushape.hardware import get_gpu
from gpushape.tracing.cost import CostTotals, op_cost

H100 = get_gpu("h100")


def _cost(t, **kw):
    return gpushape.cost(t, H100, **kw)


def test_large_bf16_gemm_is_compute_bound_at_the_attainable_rate():
    n = 8192  # the reference shape: efficiency 1
    t = trace_fn(torch.mm, (meta(n, n, dtype=torch.bfloat16), meta(n, n, dtype=torch.bfloat16)))
    op = _cost(t).ops[only(t, "mm").index]
    assert op.flops == 2 * n**3 and op.bound == "compute" and op.tensor_cores
    assert op.efficiency == pytest.approx(1.0)
    # its FLOPs at the attainable rate, and one kernel's latency (fill, epilogue, tail)
    compute_s = 2 * n**3 / H100.attainable_flops("bf16", tensor_cores=True)
    compute_s += H100.achievable.gemm_latency_s
    launch_s = H100.achievable.launch_overhead_s
    assert op.compute_s == pytest.approx(compute_s)
    assert op.roofline_time_s == pytest.approx(compute_s + launch_s)
    assert op.intensity == pytest.approx(2 * n**3 / (3 * n * n * 2))


def test_every_gemm_kernel_pays_the_latency_once():
    """Fusing three narrow projections into one wide one saves two latencies beyond their
    FLOPs (BERT's 768-wide projections on the H200: predicted at 0.97-1.01x with it)."""
    from gpushape.hardware.spec import Achievable

    def mm_s(n: int, latency: float) -> float:
        gpu = H100.replace(achievable=Achievable(gemm_latency_s=latency))
        x, w = meta(8192, 768, dtype=torch.bfloat16), meta(768, n, dtype=torch.bfloat16)
        t = trace_fn(torch.mm, (x, w))
        return gpushape.cost(t, gpu).ops[only(t, "mm").index].compute_s

    assert mm_s(768, 1e-3) - mm_s(768, 0.0) == pytest.approx(1e-3)
    narrow, wide = 3 * mm_s(768, 1e-3), mm_s(3 * 768, 1e-3)
    assert narrow - wide == pytest.approx(3 * mm_s(768, 0.0) - mm_s(3 * 768, 0.0) + 2e-3)


def test_a_kernel_with_almost_nothing_to_do_costs_the_floor_and_a_matrix_product_its_latency():
    """A squeeze-and-excitation gate's few kilobytes take the kernel floor (1.0-1.6 us a
    kernel in the profiler on the H200 and H100), not nanoseconds; a large kernel's bytes
    and a GEMM's FLOPs and latency are untouched by it."""
    import dataclasses

    floor = H100.achievable.kernel_floor_s
    assert floor > 0
    tiny = trace_fn(torch.sigmoid, (meta(64, 960, dtype=torch.bfloat16),))
    op = _cost(tiny).ops[only(tiny, "sigmoid").index]
    assert op.kernels == 1 and op.memory_s == pytest.approx(floor)
    assert op.kernel_time_s == pytest.approx(floor)
    none = H100.replace(achievable=dataclasses.replace(H100.achievable, kernel_floor_s=0.0))
    bytes_s = 2 * 64 * 960 * 2 / H100.attainable_bandwidth_bytes_per_s()
    assert bytes_s < floor
    assert gpushape.cost(tiny, none).ops[op.index].memory_s == pytest.approx(bytes_s)
    n = 1 << 24  # 32 MB: far above the floor, priced by its bytes alone either way
    big = trace_fn(torch.sigmoid, (meta(n, dtype=torch.bfloat16),))
    assert _cost(big).ops[0].memory_s == pytest.approx(gpushape.cost(big, none).ops[0].memory_s)
    mm = trace_fn(torch.mm, (meta(8, 8, dtype=torch.bfloat16), meta(8, 8, dtype=torch.bfloat16)))
    small = _cost(mm).ops[only(mm, "mm").index]  # its latency, not the floor, bounds it
    assert small.memory_s < floor < H100.achievable.gemm_latency_s <= small.compute_s


def test_elementwise_add_is_memory_bound_at_the_attainable_bandwidth():
    n = 1 << 20
    t = trace_fn(torch.add, (meta(n, dtype=torch.bfloat16), meta(n, dtype=torch.bfloat16)))
    op = _cost(t).ops[only(t, "add").index]
    assert op.bound == "memory" and not op.tensor_cores and op.min_bytes == 3 * n * 2
    assert op.memory_s == pytest.approx(3 * n * 2 / H100.attainable_bandwidth_bytes_per_s())
    assert op.compute_s == pytest.approx(n / H100.attainable_flops("bf16", tensor_cores=False))
    assert op.kernel_time_s == op.memory_s


def test_views_cost_nothing():
    t = trace_fn(lambda x: x.view(4, 4).t(), (meta(16),))
    assert all(
        c.roofline_time_s == 0 and c.launch_s == 0 and c.bound == "none" for c in _cost(t).ops
    )
    assert _cost(t).totals.ops == 0


@pytest.mark.parametrize(
    "math,tc,rate_key",
    [
        (None, False, "fp32"),  # PyTorch's default: fp32 matmuls on CUDA cores
        ("tf32", True, "tf32"),
        ("fp32", False, "fp32"),
        ("bf16", True, "bf16"),  # as under autocast
    ],
)
def test_math_modes_for_an_fp32_matmul(math, tc, rate_key):
    t = trace_fn(torch.mm, (meta(4096, 4096), meta(4096, 4096)))
    op = _cost(t, math=math).ops[0]
    assert op.tensor_cores is tc and op.math == rate_key
    peak = H100.attainable_flops(rate_key, tensor_cores=tc)
    latency = H100.achievable.gemm_latency_s  # one kernel's fill, epilogue and tail
    assert op.compute_s == pytest.approx(op.flops / (peak * op.efficiency) + latency)


def test_fp32_convolution_defaults_to_tf32_like_cudnn():
    with torch.device("meta"):
        conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
    op = _cost(gpushape.trace(conv, (meta(8, 64, 32, 32),))).ops[0]
    assert op.math == "tf32" and op.tensor_cores


def test_misaligned_dims_lower_the_efficiency_and_are_named():
    t = trace_fn(
        torch.mm, (meta(4096, 4095, dtype=torch.bfloat16), meta(4095, 4096, dtype=torch.bfloat16))
    )
    op = _cost(t).ops[0]
    assert op.misaligned == ("K=4095",) and op.efficiency < 0.25
    aligned = _cost(
        trace_fn(
            torch.mm,
            (meta(4096, 4096, dtype=torch.bfloat16), meta(4096, 4096, dtype=torch.bfloat16)),
        )
    ).ops[0]
    assert aligned.misaligned == () and aligned.compute_s < op.compute_s / 4


def test_module_aggregation_adds_up():
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Sequential(nn.Linear(128, 32)))
    t = gpushape.trace(net, (meta(16, 64),), train=True)
    report = _cost(t)
    own = report.by_module()
    total = sum((m.total for m in own.values()), CostTotals())
    assert total.flops == report.totals.flops and total.ops == report.totals.ops
    assert total.roofline_time_s == pytest.approx(report.totals.roofline_time_s)
    inclusive = report.by_module(inclusive=True)
    assert inclusive[""].total.flops == report.totals.flops
    assert inclusive["2"].total.flops == own["2.0"].total.flops  # the container holds its leaf
    first, last = own["0"], own["2.0"]
    assert first.module_type == "Linear" and first.backward.gemm_flops == first.forward.gemm_flops
    assert last.backward.gemm_flops == 2 * last.forward.gemm_flops  # its input needs a grad
    assert (report.forward + report.backward).flops == report.totals.flops


def test_cost_accepts_names_and_rejects_bad_ones():
    t = trace_fn(torch.neg, (meta(8),))
    assert gpushape.cost(t, "h200").gpu.name == "h200-sxm"
    with pytest.raises(UnknownGPUError):
        gpushape.cost(t, "h300")
    with pytest.raises(GpushapeError, match="math mode"):
        gpushape.cost(t, "h100", math="fp8")


def test_launch_overhead_counts_kernels():
    with torch.device("meta"):
        bn = nn.BatchNorm2d(8)
    t = gpushape.trace(bn, (meta(2, 8, 4, 4),), train=True)
    rec = only(t, "native_batch_norm")
    assert op_cost(rec, H100).launch_s == pytest.approx(2 * H100.achievable.launch_overhead_s)
