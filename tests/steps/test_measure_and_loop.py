"""peak_memory counts a CUDA graph's private pool (its free bytes between replays are the
graph's working memory, which the allocator's counters leave out); the loop's stage order;
busy time counts copies."""

from __future__ import annotations

import pytest

from gpushape.auditing.modes import wall_clock_s
from gpushape.steps.measure import _private_pool_free, peak_memory


def test_private_pools_free_bytes_by_pool():
    segments = [
        {"segment_pool_id": (0, 0), "total_size": 100, "allocated_size": 10},  # default pool
        {"segment_pool_id": (1, 2), "total_size": 64, "allocated_size": 16},
        {"segment_pool_id": (1, 2), "total_size": 32, "allocated_size": 32},
        {"segment_pool_id": (3, 4), "total_size": 8, "allocated_size": 0},
        {"total_size": 5, "allocated_size": 0},  # no pool id: the default pool
    ]
    assert _private_pool_free(segments) == {(1, 2): 48, (3, 4): 8}


def test_without_cuda_nothing_is_measured():
    with peak_memory(cuda=False) as peaks:
        pass
    assert peaks == {}


def test_the_loop_times_graph_layers_first():
    """graph-layers changes the host's cost only: the loop puts it before the fixes whose GPU
    savings it lets reach the wall clock."""
    from types import SimpleNamespace

    from gpushape.steps.loop_plan import applied_order as _applied_order

    report = SimpleNamespace(
        applied=[SimpleNamespace(transform=t) for t in
                 ("pad-channels", "fuse-norm-act", "fuse-norm-act", "graph-layers", "graph-layers")]
    )  # fmt: skip
    assert _applied_order(report) == ["graph-layers", "pad-channels", "fuse-norm-act"]
    assert _applied_order(None) == []
    # but after no-kv-cache, without which a decoder's layers are refused (H200, 2026-12-05:
    # GPT-2's loop timed graph-layers first, where it captured nothing)
    gpt2 = SimpleNamespace(
        applied=[SimpleNamespace(transform=t) for t in
                 ("pad-channels", "no-kv-cache", "fuse-activation", "graph-layers")]
    )  # fmt: skip
    assert _applied_order(gpt2) == [
        "no-kv-cache", "graph-layers", "pad-channels", "fuse-activation"
    ]  # fmt: skip
    # a correctness guard optimize applied unasked (pytorch#188344) is no stage of its own
    guarded = SimpleNamespace(
        applied=[SimpleNamespace(transform=t) for t in
                 ("safe-avg-pool", "safe-avg-pool", "fuse-group-norm", "channels-last")]
    )  # fmt: skip
    assert _applied_order(guarded) == ["fuse-group-norm", "channels-last"]


def test_the_loop_times_a_fix_optimize_rolled_back_where_a_finding_still_names_it():
    """A medium finding's fix that optimize's whole-step check predicted slower is timed anyway
    (applied by name): the measurement settles which prediction was right. A fix rolled back
    for its numeric check, or one only a low finding names, is not."""
    from types import SimpleNamespace

    from gpushape.auditing.finding import Severity
    from gpushape.steps.loop_plan import disputed

    slower = "predicted slower on this chip: step 28.036 -> 28.915 ms (GPU 28.036 -> 28.915 ms)"
    rolled = [
        SimpleNamespace(transform="fuse-qkv", reason=slower),
        SimpleNamespace(transform="fuse-norm-act", reason="output 0 differs: 3e-1 > 1e-2"),
        SimpleNamespace(transform="channels-last", reason=slower),
    ]
    findings = [
        SimpleNamespace(fix="fuse-qkv", severity=Severity.MEDIUM),
        SimpleNamespace(fix="fuse-norm-act", severity=Severity.HIGH),
        SimpleNamespace(fix="channels-last", severity=Severity.LOW),
    ]
    report = SimpleNamespace(rolled_back=rolled)
    assert disputed(report, SimpleNamespace(findings=findings)) == ["fuse-qkv"]
    assert disputed(None, SimpleNamespace(findings=findings)) == []


def test_the_loop_says_why_a_fix_the_audit_named_is_left_out():
    """Each high or medium finding's fix the loop does not time, with what the planning copy's
    optimize said of it (rolled back for its check, refused, skipped), or that it said
    nothing; a low finding's fix, a timed fix and the step's own fixes are not listed."""
    from types import SimpleNamespace

    from gpushape.auditing.finding import Severity
    from gpushape.steps.loop_plan import left_out

    def finding(fix, severity=Severity.MEDIUM):
        return SimpleNamespace(fix=fix, severity=severity)

    plan = SimpleNamespace(
        rolled_back=[SimpleNamespace(transform="fuse-norm-act", reason="output 0 differs")],
        refused=[SimpleNamespace(transform="sdpa", reason="a mask of another shape")],
        skipped=[],
    )
    findings = [finding("fuse-norm-act", Severity.HIGH), finding("sdpa"), finding("channels-last"),
                finding("tc-align", Severity.LOW), finding("fast-max-pool"),
                finding("cuda-graphs"), finding("channels-last")]  # fmt: skip
    got = left_out(plan, SimpleNamespace(findings=findings), ["fast-max-pool", "cuda-graphs"])
    assert got == {
        "fuse-norm-act": "rolled back: output 0 differs",
        "sdpa": "refused: a mask of another shape",
        "channels-last": "optimize's report names no reason",
    }
    assert left_out(None, SimpleNamespace(findings=[finding("sdpa")]), []) == {
        "sdpa": "optimize's report names no reason"
    }


def test_a_fix_applied_by_name_counts_the_places_its_own_stage_rewrote():
    """A disputed fix is not in the planning copy's applied list (optimize rolled it back
    there): its places come from the report of the stage that applied it by name (the BERT
    loop of 2026-12-06, compiled on an H100, showed fuse-qkv at 0 places for 12 layers)."""
    from types import SimpleNamespace

    from gpushape.steps.loop_plan import applied_count, places

    def report(*ts):
        return SimpleNamespace(applied=[SimpleNamespace(transform=t) for t in ts])

    plan = report("masked-lm-head")
    planned = {t: applied_count(plan, t) for t in ("masked-lm-head", "fuse-qkv")}
    assert planned == {"masked-lm-head": 1, "fuse-qkv": 0}
    built = {
        "+ masked-lm-head": SimpleNamespace(optimize_report=report("masked-lm-head")),
        "+ fuse-qkv": SimpleNamespace(optimize_report=report("masked-lm-head", *["fuse-qkv"] * 12)),
    }
    assert places(planned, built) == {"masked-lm-head": 1, "fuse-qkv": 12}
    # a stage that failed to build leaves the count as planned
    assert places(planned, {}) == planned
    assert applied_count(None, "fuse-qkv") == 0


def test_busy_time_counts_copies_but_the_kernel_count_does_not(monkeypatch):
    """graph-layers copies into its graphs' input buffers: device-to-device copies the GPU is
    busy with, so they count as busy time; they are not kernels."""
    from types import SimpleNamespace

    import torch
    import torch.profiler

    from gpushape.steps.measure import kernel_profile

    def event(name, us, kind="CUDA"):
        return SimpleNamespace(name=name, device_time=us, device_type=SimpleNamespace(name=kind))

    events = [
        event("conv_kernel", 300.0),
        event("Memcpy DtoD (Device -> Device)", 100.0),
        event("Memset (Device)", 10.0),
        event("aten::conv2d", 999.0, kind="CPU"),
    ]

    class FakeProfile:
        def __init__(self, **_):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def events(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    kernels, busy, top = kernel_profile(lambda: None, calls=1, cuda=True)
    assert kernels == 1 and [name for name, _ in top] == ["conv_kernel"]
    assert abs(busy - 410e-6) < 1e-12


def test_a_fix_whose_rounds_do_not_settle_its_sign_is_within_noise():
    from gpushape.steps.fix_by_fix import FixRow, _saved, sign_settled

    # Swin-T compiled, + sdpa: the stages alternate, so rounds pair up: 28-27.6, 25.9-33.7, ...
    rounds = _saved((0.0280, 0.0259, 0.0268), (0.0276, 0.0337, 0.0290))
    row = FixRow("sdpa", "+ sdpa", 12, 0.003, 0.003, -0.0022, measured_rounds_s=rounds)
    lo, hi = row.measured_spread_s
    assert lo < 0 < hi
    assert row.within_noise and row.ratio is None and row.to_dict()["within_noise"]
    # three rounds that agree still do not settle a sign (1 time in 8 by chance)
    three = FixRow("x", "+ x", 1, 0.003, 0.003, 0.003, measured_rounds_s=[0.0025, 0.003, 0.0035])
    assert three.within_noise and three.ratio == 1.0
    five = FixRow("x", "+ x", 1, 0.003, 0.003, 0.003, measured_rounds_s=[0.003] * 5)
    assert not five.within_noise
    assert not FixRow("x", "+ x", 1, 0.0, 0.0, 0.0).within_noise  # no rounds: nothing to say
    assert sign_settled([1.0] * 7 + [-1.0]) and not sign_settled([1.0] * 6 + [-1.0] * 2)
    assert sign_settled([-1.0] * 5) and not sign_settled([1.0, 1.0, 1.0, 1.0, -1.0])
    assert not sign_settled([])


def test_time_blocks_adds_rounds_until_settled_or_the_cap():
    from gpushape.steps.fix_by_fix import _stages_settled
    from gpushape.steps.measure import time_blocks

    calls = {"a": 0, "b": 0}

    def step(name):
        def run():
            calls[name] += 1

        return run

    steps = {"a": step("a"), "b": step("b")}
    times = time_blocks(steps, rounds=2, block=1, cuda=False, settled=lambda t: False, max_rounds=6)
    assert len(times["a"]) == len(times["b"]) == 6 and calls == {"a": 6, "b": 6}
    times = time_blocks(steps, rounds=2, block=1, cuda=False, settled=lambda t: True, max_rounds=6)
    assert len(times["a"]) == 2  # settled: the rounds asked for, no more
    settled = _stages_settled(["as given", "+ x", "+ failed"])
    assert settled({"as given": [0.03] * 5, "+ x": [0.02] * 5})  # the failed stage skipped
    assert not settled({"as given": [0.03] * 3, "+ x": [0.02] * 3})


def test_a_compiled_stage_saves_host_time_for_the_kernels_its_fixes_remove():
    from gpushape.auditing.modes import StepTime, compiled_stage

    given = StepTime(mode="compile", gpu_s=0.015, host_s=0.034, kernels=745)
    # its own audit prices its kernels at another rate (50 us): the given step's rate counts
    stage = StepTime(mode="compile", gpu_s=0.013, host_s=0.0312, kernels=624)
    compiled = compiled_stage(given, stage)
    assert compiled.gpu_s == 0.013
    assert compiled.host_s == pytest.approx(0.034 - 121 * 0.034 / 745)  # 5.5 ms less
    assert compiled.wall_s >= compiled.host_s
    fast_host = StepTime(mode="compile", gpu_s=0.05, host_s=0.0287, kernels=624)
    assert compiled_stage(given, fast_host).wall_s == pytest.approx(0.05, rel=0.02)  # GPU-bound
    unknown = StepTime(mode="compile", gpu_s=0.015, host_s=0.034)  # no kernels counted
    assert compiled_stage(unknown, stage) == stage


def test_optimize_prices_a_compiled_step_after_at_the_kernels_removed():
    """optimize's predicted step after, compiled, is the loop's: the host as given less the
    kernels removed, each at the given step's host cost per kernel."""
    import gpushape

    pytest.importorskip("transformers")
    r = gpushape.models.resolve_model("hf:gpt2", batch=8)
    _, report = gpushape.optimize(
        r.model, r.example_inputs, gpu="h200", mode="compile", transforms=["no-kv-cache"]
    )
    given, after = report.before.step, report.after.step
    removed = given.kernels - after.kernels
    assert removed > 0
    host_s = given.host_s - removed * given.host_s / given.kernels
    expected = wall_clock_s(after.gpu_s + after.idle_s, host_s, after.spread)
    assert report.step_after_s == pytest.approx(expected)


def test_a_compiled_loop_prices_cuda_graphs_as_reduce_overhead():
    """In compile mode the loop's cuda-graphs stage runs torch.compile's reduce-overhead mode:
    the compiled GPU work of the stage before, the host only the graph's launches."""
    from types import SimpleNamespace

    import torch

    from gpushape.auditing.api import audit
    from gpushape.auditing.modes import device_gap_s
    from gpushape.hardware import calibrated, get_gpu
    from gpushape.steps.loop_predict import GIVEN, predictions
    from gpushape.steps.loop_predict import expected_steps as _expected
    from gpushape.steps.step import build_step
    from gpushape.steps.variants import Spec
    from transforms.nets import ConvNet

    with torch.device("meta"):
        model = ConvNet()
    x = torch.empty(64, 3, 32, 32, device="meta")
    from gpushape.steps.batch import Batch

    batch = Batch(inputs=(x,), loss=lambda out: out.float().mean(), samples=64)
    step = build_step(model, batch, "sgd")
    built = {GIVEN: SimpleNamespace(step=step), "+ cuda-graphs": SimpleNamespace(step=step)}
    specs = {GIVEN: Spec(runner="compile"), "+ cuda-graphs": Spec(runner="compile-graphs")}
    report = audit(model, (x,), "h200", train=True, mode="compile", optimizer=step.optimizer)
    out = _expected(specs, built, report, predictions(report), "h200", "compile")
    graph = audit(model, (x,), "h200", train=True, mode="graph", optimizer=step.optimizer)
    gpu, wall = out[GIVEN]
    # the GPU idles between the kernels those graphs replay, at the profile's rate for them
    idle = report.step.kernels * device_gap_s(calibrated(get_gpu("h200")), "compile-graphs")
    assert idle > 0
    # and the copies into the graphs' static inputs: the images in, the outputs' gradient
    bandwidth = calibrated(get_gpu("h200")).attainable_bandwidth_bytes_per_s()
    copies = 2 * report.boundary_bytes / bandwidth
    assert report.boundary_bytes == (64 * 3 * 32 * 32 + 64 * 10) * 2  # bf16 images, (64, 10) out
    graphed = (gpu + copies, wall_clock_s(gpu + copies + idle, graph.step.host_s))
    assert out["+ cuda-graphs"] == pytest.approx(graphed)
    assert out["+ cuda-graphs"][1] < wall  # a tiny compiled step is host-bound: graphs pay


def test_an_eager_whole_step_graph_after_the_fused_optimizer_counts_its_saving_once():
    """The audit of a stage whose step runs the fused optimizer prices the fused kernels
    already; the whole-step graph built on it saves launches and idle time, not the fused
    step's GPU saving a second time (BERT-base on an H100 had its CUDA graph predicted at
    1.99 ms against 0.12 measured, 1.17 of it that saving counted twice)."""
    from types import SimpleNamespace

    import torch

    from gpushape.auditing.api import audit
    from gpushape.steps.batch import Batch
    from gpushape.steps.loop_predict import GIVEN, predictions
    from gpushape.steps.loop_predict import expected_steps as _expected
    from gpushape.steps.step import build_step
    from gpushape.steps.variants import Spec
    from transforms.nets import ConvNet

    with torch.device("meta"):
        model = ConvNet().to(torch.bfloat16)
    x = torch.empty(64, 3, 32, 32, device="meta", dtype=torch.bfloat16)
    batch = Batch(inputs=(x,), loss=lambda out: out.float().mean(), samples=64)
    given, fused = build_step(model, batch, "adamw"), build_step(model, batch, "adamw-fused")
    built = {
        GIVEN: SimpleNamespace(step=given),
        "+ fused-optimizer": SimpleNamespace(step=fused, optimize_report=None),
        "+ cuda-graphs": SimpleNamespace(step=fused, optimize_report=None),
    }
    specs = {
        GIVEN: Spec(runner="eager"),
        "+ fused-optimizer": Spec(runner="eager", fused_optimizer=True),
        "+ cuda-graphs": Spec(runner="graph", fused_optimizer=True),
    }
    report = audit(model, (x,), "h200", train=True, mode="eager", optimizer=given.optimizer)
    predicted = predictions(report)
    assert predicted["fused-optimizer"][0] > 0
    out = _expected(specs, built, report, predicted, "h200", "eager")
    graph = audit(model, (x,), "h200", train=True, mode="graph", optimizer=fused.optimizer)
    assert out["+ cuda-graphs"] == pytest.approx((graph.step.gpu_s, graph.step.wall_s))
    # what the graph saves on the GPU is its idle time, not the fused step's kernels again
    gpu_saved = out["+ fused-optimizer"][0] - out["+ cuda-graphs"][0]
    assert abs(gpu_saved) < predicted["fused-optimizer"][0]


def test_the_loop_result_keeps_each_stages_predicted_step():
    from gpushape.steps.fix_by_fix import GIVEN, LoopResult
    from gpushape.steps.measure import StepStats

    def stats_of(name, s):
        return StepStats(variant=name, step_times_s=(s,), warmup_s=0.1, samples=8, tokens=0)

    stats = {GIVEN: stats_of(GIVEN, 0.02), "+ cuda-graphs": stats_of("+ cuda-graphs", 0.01)}
    expected = {GIVEN: (0.015, 0.02), "+ cuda-graphs": (0.015, 0.016)}
    result = LoopResult("m", "eager", stats, [], 0.02, expected=expected)
    stages = result.to_dict()["predicted_stages"]
    assert stages["+ cuda-graphs"] == {"gpu_s": 0.015, "wall_s": 0.016}
    assert result.speedup == pytest.approx(2.0)
