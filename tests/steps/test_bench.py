"""`bench()` and `loop()` on the CPU: variants built and timed alternately, failures reported
per variant, fixes measured one by one (CPU times check the plumbing, not a GPU)."""

from __future__ import annotations

import pytest
import torch

from _chips import H100_DATASHEET
from gpushape.errors import GpushapeError
from gpushape.steps import bench, loop, parse_variant
from gpushape.steps.measure import StepStats, time_blocks
from transforms.nets import ConvNet

FAST = dict(rounds=2, block=1, warmup=1)


def test_variants_are_timed_and_a_failing_one_is_reported():
    result = bench(ConvNet(), (torch.zeros(2, 3, 16, 16),), variants=["channels-last", "graph"],
                   gpu="h200", **FAST)  # fmt: skip
    assert set(result.stats) == {"eager", "channels-last"}
    assert "graph" in result.failed and "CUDA" in result.failed["graph"]
    s = result.stats["eager"]
    assert len(s.step_times_s) == 2 and s.samples == 2
    assert s.mfu is None and s.bound == "unknown"  # no GPU here: no MFU, no busy time
    assert result.ratio("eager") == 1.0
    doc = result.to_dict()
    assert doc["variants"]["channels-last"]["speedup_vs_baseline"] > 0


def test_optimize_variant_applies_checked_fixes():
    # the H100 datasheet: no measured host rates, so the tiny batch is not host-bound
    result = bench(ConvNet(), (torch.zeros(2, 3, 16, 16),), variants=["optimize"],
                   gpu=H100_DATASHEET, **FAST)  # fmt: skip
    report = result.optimize_reports["optimize"]
    assert "fuse-norm-act" in {c.transform for c in report.applied}
    assert all(v.passed for v in report.verified.values())


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("fast", "unknown variant 'fast'"),
        ("compile+compile-graphs", "names 2 runners"),
        ("compile-graphs+graph", "names 2 runners"),
        ("optimize+optimize-compile", "exclude each other"),
        ("optimize+aten-random", "an option of torch.compile"),
        ("aten-random+graph", "an option of torch.compile"),
        ("optimize+tuned-kernels", "tuned-kernels is an option of torch.compile"),
    ],
)
def test_bad_variant_names(name, says):
    with pytest.raises(GpushapeError, match=says):
        parse_variant(name)


def test_aten_random_compiles_with_the_modes_options_and_fallback_random(monkeypatch):
    """torch.compile takes a mode or options: aten-random passes the mode's options plus
    Inductor's fallback_random; without it the mode is passed as it is."""
    from gpushape.steps.compiling import compiled as _compiled
    from gpushape.steps.compiling import inductor_options as _inductor_options
    from gpushape.steps.variants import Spec

    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    spec = Spec.of("optimize-compile+compile-graphs+aten-random")
    assert spec.aten_random and spec.runner == "compile-graphs" and not spec.tuned_kernels
    assert not Spec.of("compile-graphs").aten_random
    tuned = Spec.of("compile+tuned-kernels+aten-random")
    assert _inductor_options(tuned) == {"fallback_random": True, "coordinate_descent_tuning": True}
    assert _inductor_options(Spec.of("compile")) == {}
    model = torch.nn.Linear(2, 2)
    _compiled(model, "reduce-overhead", _inductor_options(spec))
    _compiled(model, None, {"fallback_random": True})
    _compiled(model, "reduce-overhead", {})
    _compiled(model, None, _inductor_options(Spec.of("compile+tuned-kernels")))
    assert calls == [
        {"options": {"triton.cudagraphs": True, "fallback_random": True}},
        {"options": {"fallback_random": True}},
        {"mode": "reduce-overhead"},
        {"options": {"coordinate_descent_tuning": True}},
    ]


def test_meta_models_are_refused():
    with torch.device("meta"):
        model = ConvNet()
    with pytest.raises(GpushapeError, match="not meta"):
        bench(model, (torch.zeros(2, 3, 8, 8, device="meta"),), **FAST)


def test_time_blocks_alternates_variants():
    order = []
    steps = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = time_blocks(steps, rounds=3, block=2, cuda=False)
    assert order == ["a", "a", "b", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}


def test_stats_quantiles_and_rates():
    s = StepStats(variant="x", step_times_s=(0.1, 0.2, 0.3, 0.4), warmup_s=1.0, samples=8,
                  tokens=0, gpu_busy_s=0.2, flops=1e12, peak_flops=1e15)  # fmt: skip
    assert s.median_s == pytest.approx(0.25) and s.samples_per_s == pytest.approx(32)
    assert s.quantile(0.0) == 0.1 and s.quantile(1.0) == 0.4
    assert s.mfu == pytest.approx(1e12 / 0.25 / 1e15)
    assert s.bound == "host"  # busy 0.2 of a 0.25 s step: 80%, under the 85% line


def test_loop_measures_each_applied_fix():
    pytest.importorskip("transformers")
    from transforms.nets import tiny_gpt2

    model = tiny_gpt2(attn="eager")
    result = loop(model, (torch.zeros(2, 32, dtype=torch.long),), gpu="h200", **FAST)
    stages = list(result.stages)
    assert stages[0] == "as given" and "+ sdpa" in stages
    row = next(r for r in result.rows if r.fix == "sdpa")
    assert row.measured_wall_s is not None and row.places == 1
    assert any("manual-attention" in f for f in row.findings)
    assert "+ cuda-graphs" in result.failed  # no CUDA here
    assert result.to_dict()["fixes"][0]["fix"] == result.rows[0].fix


def test_loop_refuses_graph_mode():
    with pytest.raises(GpushapeError, match="eager or compile"):
        loop(ConvNet(), (torch.zeros(2, 3, 8, 8),), mode="graph")


def test_top_kernels_sum_by_name_per_step_longest_first():
    from types import SimpleNamespace

    from gpushape.steps.measure import top_by_time

    events = [SimpleNamespace(name=n, device_time=us) for n, us in
              [("gemm", 300.0), ("relu", 50.0), ("gemm", 300.0), ("norm", 100.0)]]  # fmt: skip
    top = top_by_time(events, calls=2, top=2)
    assert [n for n, _ in top] == ["gemm", "norm"]
    assert top[0][1] == pytest.approx(300e-6) and top[1][1] == pytest.approx(50e-6)


def test_cpu_bench_has_no_kernel_profile():
    assert (
        StepStats(variant="x", step_times_s=(1.0,), warmup_s=0, samples=1, tokens=0).top_kernels
        == ()
    )


def test_issue_time_needs_cuda():
    from gpushape.steps.measure import issue_time

    assert issue_time(lambda: None, cuda=False) is None


def test_optimize_with_a_graph_runner_optimizes_for_graph_mode():
    from gpushape.steps.variants import Spec

    assert Spec.of("optimize+graph").optimize_mode == "graph"
    assert Spec.of("optimize").optimize_mode == "eager"
    assert Spec.of("optimize-compile+compile").optimize_mode == "compile"


def test_a_captured_hugging_face_step_keeps_flash_attention():
    pytest.importorskip("transformers")
    from _hf_masks import old_masks
    from gpushape.models.hf_masks import IMPLEMENTATION, traced_mask_gap
    from gpushape.steps import synthetic_batch
    from gpushape.steps.variants import _mask_for_capture
    from transforms.nets import tiny_gpt2

    model = tiny_gpt2()
    batch = synthetic_batch(model, (torch.zeros(2, 16, dtype=torch.int64),))
    if traced_mask_gap(model) is None:  # a release that skips the mask itself
        assert _mask_for_capture(model, batch) == []
    with old_masks():  # one that builds it while capturing (up to 5.17)
        (note,) = _mask_for_capture(model, batch)
    assert note.startswith("skip-attention-mask for the capture")
    assert model.config._attn_implementation == IMPLEMENTATION


def test_compile_graphs_runner_starts_a_graph_step_each_call(monkeypatch):
    from gpushape.steps.compiling import each_step_graphed as _each_step_graphed
    from gpushape.steps.variants import Spec

    assert Spec.of("optimize-compile+compile-graphs").runner == "compile-graphs"
    assert Spec.of("optimize-compile+compile-graphs").optimize_mode == "compile"
    steps = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1))
    forward = _each_step_graphed(lambda x, scale=1: x * scale)
    assert forward(2, scale=3) == 6 and forward(1) == 1
    assert steps == [1, 1]
    with pytest.raises(GpushapeError, match="names 2 runners"):
        parse_variant("compile+compile-graphs")


def test_caller_backward_runs_the_backward_with_multithreading_off():
    """caller-backward keeps the backward on the calling thread: the flag autograd's engine
    reads is off while it runs (a gradient hook sees it), and back on after."""
    from gpushape.steps import synthetic_batch
    from gpushape.steps.variants import Spec, build_variant

    seen = []
    model = ConvNet()
    model.register_full_backward_hook(lambda *_: seen.append(torch._C._is_multithreading_enabled()))
    batch = synthetic_batch(model, (torch.zeros(2, 3, 16, 16),))
    spec = Spec.of("fused-optimizer+caller-backward")
    assert spec.caller_backward and spec.fused_optimizer
    variant = build_variant("caller-backward", model, batch, optimizer="sgd", spec=spec)
    variant.run()
    assert seen == [False] and torch._C._is_multithreading_enabled()
    assert "backward on the calling thread" in variant.notes
    plain = build_variant("eager", model, batch, optimizer="sgd")
    seen.clear()
    plain.run()
    assert seen == [True]


def test_held_issue_time_is_the_hosts_own_time_and_none_where_it_waited(monkeypatch):
    """With the GPU held busy by a kernel queued first, a step's issue time is the host's own;
    a step that returns only after the hold ends waited on the GPU, and gets no figure."""
    import time

    from gpushape.steps import measure

    held = []
    monkeypatch.setattr(measure.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(measure, "hold_gpu", held.append)
    assert measure.held_issue_time(lambda: None, cuda=False) is None

    host = measure.held_issue_time(lambda: time.sleep(0.002), calls=3, cuda=True)
    assert host is not None and 0.002 <= host < 0.05
    assert held and all(h >= 0.05 for h in held)  # held longer than the host took

    def waits():  # as a step blocked until the hold ends would: longer than the hold
        time.sleep(held[-1] if held else 0.06)

    assert measure.held_issue_time(waits, calls=2, cuda=True) is None


@pytest.mark.gpu
def test_held_issue_time_on_a_gpu():
    """A step of small kernels issues faster than the held GPU runs: a figure; a step that
    syncs waits for the hold to end: none."""
    x = torch.randn(256, 256, device="cuda")
    from gpushape.steps.measure import held_issue_time

    def kernels():
        for _ in range(50):
            x.mul_(1.0)

    def syncs():
        kernels()
        torch.cuda.synchronize()

    host = held_issue_time(kernels, cuda=True)
    assert host is not None and host > 0
    assert held_issue_time(syncs, cuda=True) is None


def test_mfu_is_also_given_against_the_measured_gemm_peak(monkeypatch):
    from gpushape.hardware import calibrated, get_gpu
    from gpushape.steps import run

    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    monkeypatch.setattr(run, "_chip", lambda m, gpu: calibrated("h200"))
    measured = run.measured_peak(model, "h200")
    assert measured == pytest.approx(7.666e14, rel=1e-3)  # the shipped profile's bf16 GEMM
    assert run.dense_peak(model, "h200") == pytest.approx(989.4e12)
    monkeypatch.setattr(run, "_chip", lambda m, gpu: get_gpu("h100"))  # datasheet only
    assert run.measured_peak(model, "h100") is None
    s = StepStats(variant="x", step_times_s=(0.5,), warmup_s=1.0, samples=1, tokens=0,
                  flops=1e14, peak_flops=1e15, measured_peak_flops=5e14)  # fmt: skip
    assert s.mfu == pytest.approx(0.2) and s.mfu_measured == pytest.approx(0.4)
    assert s.to_dict()["mfu_measured"] == pytest.approx(0.4)


def test_each_variant_reports_its_own_flops():
    result = bench(ConvNet(), (torch.zeros(2, 3, 16, 16),), variants=["channels-last"],
                   gpu="h200", **FAST)  # fmt: skip
    eager, cl = result.stats["eager"], result.stats["channels-last"]
    assert eager.variant_flops == eager.flops and eager.flops > 0
    assert cl.variant_flops == pytest.approx(eager.flops)  # a layout changes no FLOP


def test_a_csv_from_before_a_new_column_is_rewritten_with_the_longer_header(tmp_path):
    import csv

    from gpushape.steps.results import append_csv

    path = tmp_path / "b.csv"
    append_csv(path, [{"a": 1, "b": 2}], ("a", "b"))
    append_csv(path, [{"a": 3, "b": 4, "c": 5}], ("a", "b", "c"))
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"a": "1", "b": "2", "c": ""}, {"a": "3", "b": "4", "c": "5"}]
    append_csv(path, [{"a": 6, "b": 7, "c": 8}], ("a", "b", "c"))  # same header: appended
    assert path.read_text().count("a,b,c") == 1 and path.read_text().endswith("6,7,8\n")


def test_compile_joined_with_graph_compiles_then_captures_the_whole_step(monkeypatch):
    """compile+graph: the model compiled (its mode kept), then the whole step captured; the
    graph runner's optimize mode is unchanged by it."""
    from gpushape.steps import variants
    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.variants import Spec, build_variant

    spec = Spec.of("optimize-compile+compile-max-autotune+graph")
    assert (spec.runner, spec.compile_first, spec.optimize_mode) == (
        "graph", "compile-max-autotune", "compile")  # fmt: skip
    assert Spec.of("graph").compile_first is None
    assert Spec.of("compile").compile_first is None
    assert Spec.of("compile+graph+aten-random").aten_random
    compiled, captured = [], []
    monkeypatch.setattr(variants, "compiled", lambda m, mode, r: compiled.append(mode) or m)
    monkeypatch.setattr(variants, "_graphed", lambda step: captured.append(step) or step)
    monkeypatch.setattr(variants, "_mask_for_capture", lambda m, b: [])
    monkeypatch.setattr(variants, "_graph_warnings", lambda m: [])
    model = ConvNet()
    batch = synthetic_batch(model, (torch.zeros(2, 3, 8, 8),))
    built = build_variant("compile+graph", model, batch)
    assert compiled == [None] and len(captured) == 1
    assert "the model compiled" in " ".join(built.notes)


def test_a_transform_named_beside_optimize_is_applied_after_the_findings_fixes(monkeypatch):
    """optimize-compile+fuse-qkv: optimize as usual, then fuse-qkv by name (kept whatever its
    prediction); the report counts it applied, not rolled back. A transform alone is an error."""
    from types import SimpleNamespace as NS

    from gpushape.steps import variants
    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.variants import Spec, build_variant

    assert Spec.of("optimize-compile+fuse-qkv").also == ("fuse-qkv",)
    assert Spec.of("optimize").also == ()
    with pytest.raises(GpushapeError, match="name it beside optimize"):
        parse_variant("compile+fuse-qkv")
    with pytest.raises(GpushapeError, match="or a transform's id"):
        parse_variant("optimize+fuse-everything")
    calls = []

    def optimized(model, batch, gpu, mode, transforms=None, quiet_sites=False):
        calls.append((mode, transforms))
        rolled = [NS(transform="fuse-qkv", reason="predicted slower")] if transforms is None else []
        applied = [NS(transform="fuse-qkv" if transforms else "masked-lm-head")]
        return model, NS(applied=applied, rolled_back=rolled, refused=[], verified={}, after=None,
                         mode=mode)  # fmt: skip

    monkeypatch.setattr(variants, "_optimized", optimized)
    model = ConvNet()
    batch = synthetic_batch(model, (torch.zeros(2, 3, 8, 8),))
    built = build_variant("optimize-compile+fuse-qkv", model, batch)
    assert calls == [("compile", None), ("compile", ("fuse-qkv",))]
    report = built.optimize_report
    assert [c.transform for c in report.applied] == ["masked-lm-head", "fuse-qkv"]
    assert report.rolled_back == []
    assert "applied fuse-qkv, masked-lm-head" in built.notes[0]


@pytest.mark.gpu
def test_compile_joined_with_graph_replays_the_compiled_step_on_a_gpu():
    """compile+graph: after its warm-up steps, each replay is one training step of the compiled
    model: the weights track the compiled variant's, step for step."""
    from gpushape.steps.batch import synthetic_batch
    from gpushape.steps.variants import GRAPH_WARMUP, build_variant

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256), torch.nn.Linear(256, 8)
    ).cuda()
    batch = synthetic_batch(model, (torch.randn(32, 64, device="cuda"),))
    compiled = build_variant("compile", model, batch)
    graphed = build_variant("compile+graph", model, batch)
    assert graphed.steps_run == GRAPH_WARMUP and "the model compiled" in " ".join(graphed.notes)
    for _ in range(GRAPH_WARMUP + 4):
        compiled.run()
    for _ in range(4):
        graphed.run()
    torch.cuda.synchronize()
    for a, b in zip(compiled.step.model.parameters(), graphed.step.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_cudnn_benchmark_is_on_while_its_variant_runs_and_only_then():
    """cudnn-benchmark turns torch.backends.cudnn.benchmark on for the variant's own steps
    (a forward hook sees it) and leaves PyTorch's default to the variants timed beside it."""
    from gpushape.steps import synthetic_batch
    from gpushape.steps.variants import Spec, build_variant

    seen = []
    model = ConvNet()
    model.register_forward_hook(lambda *_: seen.append(torch.backends.cudnn.benchmark))
    batch = synthetic_batch(model, (torch.zeros(2, 3, 16, 16),))
    assert Spec.of("optimize+graph+cudnn-benchmark").cudnn_benchmark
    before = torch.backends.cudnn.benchmark
    tuned = build_variant("cudnn-benchmark", model, batch, optimizer="sgd")
    plain = build_variant("eager", model, batch, optimizer="sgd")
    tuned.run()
    plain.run()
    assert seen == [True, before] and torch.backends.cudnn.benchmark == before
    assert any("cudnn.benchmark" in n for n in tuned.notes)
