import time

import pytest
import torch

from gpushape.bench import Timing, compare, cuda_graph, kernel_times, time_fn
from gpushape.hardware import get_gpu


def test_times_a_sleep_on_the_cpu():
    timing = time_fn(lambda: time.sleep(0.002), warmup=1, repeats=5, device="cpu")
    assert timing.method == "perf_counter" and timing.repeats == 5
    assert 0.0015 < timing.median_s < 0.05
    assert timing.min_s <= timing.p10_s <= timing.median_s <= timing.p90_s


def test_warmup_and_rotation_over_input_sets():
    seen = []
    sets = [(torch.full((2,), float(i)),) for i in range(3)]
    timing = time_fn(lambda x: seen.append(int(x[0])), inputs=sets, warmup=2, repeats=6)
    assert seen == [0, 1, 0, 1, 2, 0, 1, 2]  # 2 warm-up calls, then 6 rotating repeats
    assert timing.input_sets == 3 and timing.warmup == 2


def test_l2_flush_runs_before_every_repeat(monkeypatch):
    fills = []
    original = torch.Tensor.fill_

    def spy(self, value):
        fills.append(self.numel())
        return original(self, value)

    monkeypatch.setattr(torch.Tensor, "fill_", spy)
    spec = get_gpu("a10")  # 6 MiB of L2 -> a 12 MiB flush buffer of int32
    timing = time_fn(lambda: None, warmup=0, repeats=4, flush_l2=True, gpu=spec, device="cpu")
    assert timing.flushed_l2
    assert fills == [2 * spec.l2_bytes // 4] * 4


def test_l2_flush_needs_a_spec_on_cpu():
    with pytest.raises(ValueError, match="GPUSpec"):
        time_fn(lambda: None, repeats=1, flush_l2=True, device="cpu")


def test_quantiles_interpolate():
    timing = Timing((4.0, 1.0, 3.0, 2.0), "perf_counter", 0, False, 1)
    assert timing.median_s == 2.5
    assert timing.quantile(0.0) == 1.0 and timing.quantile(1.0) == 4.0
    assert timing.quantile(0.5) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        timing.quantile(1.5)


def test_bad_repeats():
    with pytest.raises(ValueError):
        time_fn(lambda: None, repeats=0)


def test_compare_alternates_variants():
    order = []
    result = compare(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")},
        rounds=3,
        repeats_per_round=2,
        warmup=0,
        device="cpu",
    )
    assert order == (["a"] * 2 + ["b"] * 2) * 3
    assert result["a"].repeats == 6 and result["b"].repeats == 6


@pytest.mark.gpu
def test_cuda_events_time_a_gpu_matmul():
    x = torch.randn(2048, 2048, device="cuda")
    timing = time_fn(lambda: x @ x, warmup=2, repeats=5, flush_l2=True)
    assert timing.method == "cuda-events" and timing.median_s > 0


def test_cuda_graph_needs_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        cuda_graph(lambda: None)


@pytest.mark.gpu
def test_cuda_graph_replays_a_training_step():
    """Forward and backward captured once; each replay recomputes into the same buffers."""
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    x = torch.randn(32, 64, device="cuda")
    out = {}

    def step():
        out["g"] = torch.autograd.grad((x @ w).square().sum(), w)[0]

    replay = cuda_graph(step)
    x.copy_(torch.randn_like(x))
    replay()
    torch.cuda.synchronize()
    expect = torch.autograd.grad((x @ w).square().sum(), w)[0]
    torch.testing.assert_close(out["g"], expect)


@pytest.mark.gpu
def test_cuda_graph_replay_keeps_what_the_captured_step_owns():
    """The step's closure owns its input; the caller keeps only the replay. The replay must
    keep the input alive: freed, its memory would be handed out again and the graph would
    read someone else's numbers (or fault)."""
    import gc

    out = torch.zeros(1 << 20, device="cuda")

    def make_step():
        x = torch.full((1 << 20,), 3.0, device="cuda")
        return lambda: out.copy_(x * 2)

    replay = cuda_graph(make_step())
    gc.collect()
    others = [torch.full((1 << 20,), -1.0, device="cuda") for _ in range(16)]
    out.zero_()
    replay()
    torch.cuda.synchronize()
    assert bool(torch.all(out == 6.0)) and len(others) == 16


@pytest.mark.gpu
def test_kernel_times_lists_one_calls_kernels_in_order():
    x = torch.randn(1024, 1024, device="cuda")
    listing = kernel_times(lambda: (x @ x).relu(), calls=4)
    assert len(listing) == 2 and all(us > 0 for _, us in listing)
    (gemm, _), (relu, _) = listing  # launch order: the matmul, then relu's elementwise kernel
    assert "elementwise" not in gemm and "elementwise" in relu


def test_the_command_line_names_python_m_gpushape(monkeypatch):
    import sys

    from gpushape.bench.record import command_line

    monkeypatch.setattr(sys, "argv", ["/x/site-packages/gpushape/__main__.py", "bench", "a b"])
    assert command_line() == "python -m gpushape bench 'a b'"
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--out", "o.json"])
    assert command_line() == "bench_x.py --out o.json"
