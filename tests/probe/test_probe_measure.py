"""The probe's measurement functions: callable on the CPU at tiny sizes; plausible on a GPU."""

import pytest
import torch

from gpushape.hardware import current_gpu, get_gpu
from gpushape.probe import measure as pm
from gpushape.probe.plan import full_plan, quick_plan, tiny_plan
from gpushape.probe.runner import Task, _run_task, build_tasks, check_kernels

CPU = pm.MeasureConfig(device="cpu", repeats=2, target_s=1e-4, max_inner=4)


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "fp16", "bf16"])
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_gemm_on_cpu(dtype, layout):
    seconds = pm.gemm_s(24, 40, 33, dtype, CPU, layout=layout)
    assert 0 < seconds < 1


def test_fp8_gemm_where_supported():
    if not pm.fp8_supported("cpu"):
        pytest.skip("this torch build has no fp8 _scaled_mm on the CPU")
    assert pm.gemm_s(32, 32, 32, "fp8", CPU) > 0


def test_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        pm.gemm_s(8, 8, 8, "bf16", CPU, layout="tn")


def test_conv_copy_and_launch_on_cpu():
    shape = pm.ConvShape(batch=2, cin=5, cout=8, hw=9, kernel=3)
    assert pm.conv_s(shape, "bf16", CPU) > 0
    assert shape.flops == 2 * 2 * 9 * 9 * 8 * 5 * 9
    assert pm.conv_flops(1, 3, 64, 224, 7, stride=2) == 2 * 112 * 112 * 64 * 3 * 49
    assert pm.copy_bytes_per_s(2**20, CPU) > 0
    assert 0 < pm.launch_overhead_s(CPU, kernels=20) < 1e-2
    with pytest.raises(ValueError, match="CUDA"):
        pm.graph_launch_overhead_s(CPU)


def test_per_call_rotates_inputs_and_sizes_samples():
    seen = []
    seconds = pm.per_call_s(lambda i: seen.append(i), [(0,), (1,), (2,)], CPU)
    assert seconds > 0 and set(seen) == {0, 1, 2}
    assert seen[:6] == [0, 1, 2, 0, 1, 2]  # every call takes the next set


def test_input_sets_cover_twice_the_l2():
    cfg = pm.MeasureConfig(l2_bytes=60 * 2**20)
    assert pm.input_sets_for(64 * 2**20, cfg) == 1  # does not fit: one set
    assert pm.input_sets_for(40 * 2**20, cfg) == 3
    assert pm.input_sets_for(1024, cfg) == cfg.max_input_sets
    assert pm.input_sets_for(1024, pm.MeasureConfig(l2_bytes=0)) == 1


def test_math_mode_sets_and_restores_tf32():
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    with pm.math_mode("tf32", cudnn_benchmark=True):
        assert matmul.allow_tf32 and torch.backends.cudnn.benchmark
    with pm.math_mode("fp32"):
        assert not matmul.allow_tf32
    assert matmul.allow_tf32 == before


def test_kernel_check_passes_on_cpu():
    check_kernels("cpu", fp8=False)


def test_failed_point_is_recorded_not_raised():
    def refuse(cfg):
        raise RuntimeError("Expected both dimensions of mat2 to be divisble by 16\nmore")

    row = _run_task(Task("gemm_align", {"size": 4095}, 10, refuse, 0.0), CPU)
    assert row["flops_per_s"] is None and row["error"].startswith("Expected both")


def test_budgets_fit_the_targets():
    # The datasheet budget (what the probe prints) must leave room under the issue's limits.
    spec = get_gpu("h200")
    full = sum(t.est_s for t in build_tasks(full_plan(), spec, fp8=True))
    quick = sum(t.est_s for t in build_tasks(quick_plan(), spec, fp8=True))
    assert quick < 45 and full < 180, (quick, full)
    assert len(build_tasks(tiny_plan(), spec, fp8=False)) < 80


def test_align_sweep_covers_the_issue_offsets():
    rows = [
        t.row
        for t in build_tasks(full_plan(), get_gpu("h200"), fp8=True)
        if t.sweep == "gemm_align" and t.row["dtype"] == "bf16" and t.row["layout"] == "nn"
    ]
    sizes = {(r["dim"], r["base"]): set() for r in rows}
    for r in rows:
        sizes[(r["dim"], r["base"])].add(r["size"] - r["base"])
    assert set(sizes) == {(d, b) for d in "MNK" for b in (1024, 4096)}
    for offsets in sizes.values():
        assert set(range(17)) | {24, 32, 64, 128} <= offsets
    k4095 = next(r for r in rows if r["dim"] == "K" and r["size"] == 4095)
    assert (k4095["m"], k4095["n"], k4095["k"]) == (8192, 8192, 4095)


@pytest.mark.gpu
def test_gpu_measurements_are_plausible():
    spec = current_gpu()
    cfg = pm.MeasureConfig(device="cuda", l2_bytes=spec.l2_bytes)
    bw = pm.copy_bytes_per_s(2**30, cfg)
    assert 0.5 < bw / spec.memory_bandwidth_bytes_per_s <= 1.05
    flops = pm.gemm_flops(8192, 8192, 8192) / pm.gemm_s(8192, 8192, 8192, "bf16", cfg)
    assert 0.3 < flops / spec.peak_flops("bf16") <= 1.05
    eager, graph = pm.launch_overhead_s(cfg), pm.graph_launch_overhead_s(cfg)
    assert 0 < graph < eager < 1e-4


@pytest.mark.gpu
def test_the_kernel_floor_is_a_microsecond_or_two_on_the_gpu():
    """A kernel over a few kilobytes runs about 1-2 us on Hopper (the profiler's times of
    tiny modules on the H200 and H100): far above its bytes' time, far below a launch."""
    from gpushape.probe.memory import measure_kernel_floor

    floor = measure_kernel_floor("cuda")
    assert floor is not None and set(floor["by_op"]) == {"add", "mul", "sigmoid", "sum", "fill"}
    assert 0.3e-6 < floor["seconds"] < 6e-6


def test_the_graph_replay_gap_is_none_without_cuda():
    from gpushape.probe.memory import measure_graph_replay_gap

    assert measure_graph_replay_gap("cpu") is None


@pytest.mark.gpu
def test_a_graph_replay_boundary_costs_the_gpu_microseconds():
    """48 graphs of 4 kernels against one graph of 192: the boundaries add idle time, a few
    microseconds each (a launch's latency reaching the GPU), never a large share."""
    from gpushape.probe.memory import measure_graph_replay_gap

    gap = measure_graph_replay_gap("cuda")
    assert gap is not None and gap["chain_s"] >= gap["single_s"] > 0
    assert 0 <= gap["seconds"] < 30e-6
