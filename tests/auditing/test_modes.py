"""--mode: advice that holds in the mode the model runs (eager, torch.compile, a CUDA graph)."""

from __future__ import annotations

import pytest
import torch

import gpushape
from gpushape.auditing.finding import Severity
from gpushape.auditing.modes import wall_clock_s
from gpushape.errors import GpushapeError
from gpushape.models import create_model


def _audit(name: str, mode: str, **options):
    model, inputs = create_model(name, **options)
    return gpushape.audit(model, inputs, gpu="h200", train=True, mode=mode)


@pytest.fixture(scope="module")
def gpt2():
    return {mode: _audit("gpt2", mode, batch=8) for mode in ("eager", "compile", "graph")}


def _finding(report, rule):
    return next(f for f in report.findings if f.rule == rule)


def test_compile_mode_drops_what_inductor_already_does(gpt2):
    eager, compiled = _finding(gpt2["eager"], "tc-align"), _finding(gpt2["compile"], "tc-align")
    assert eager.severity == Severity.HIGH and eager.est_saving_s > 0
    assert compiled.severity == Severity.INFO and compiled.est_saving_s == 0
    assert "under torch.compile this saves nothing" in compiled.message
    assert compiled.evidence["saving_outside_mode_s"] == pytest.approx(eager.est_saving_s)
    assert not any(compiled.label in f for f in (gpt2["compile"].combined.fixes or ()))


def test_each_saving_has_its_wall_clock_share(gpt2):
    f, step = _finding(gpt2["eager"], "tc-align"), gpt2["eager"].step
    assert step.bound == "GPU"
    # the GPU's saving, down to where the host's dispatch takes over as the pace
    gpu_side = step.gpu_s + step.idle_s  # its kernels and the GPU's idle time between them
    expected = step.wall_s - wall_clock_s(gpu_side - f.est_saving_s, step.host_s, step.spread)
    assert f.evidence["wall_saving_s"] == pytest.approx(expected)
    assert 0.5 * f.est_saving_s < expected <= f.est_saving_s


def test_graph_mode_has_cheap_launches(gpt2):
    eager, graph = gpt2["eager"].step, gpt2["graph"].step
    assert graph.gpu_s == pytest.approx(eager.gpu_s) and graph.host_s < eager.host_s / 5
    assert gpt2["graph"].to_dict()["mode"] == "graph"


def test_a_host_bound_step_says_a_gpu_saving_is_not_a_wall_saving():
    report = _audit("resnet50", "eager", batch=2)
    assert report.step.bound == "host"
    fused = [f for f in report.findings if f.rule == "unfused-norm-act"]
    # gpushape's fused BatchNorm costs the host more than batch_norm and relu: the host-bound
    # step takes longer with it, and the finding says so at info, whatever its GPU saving
    assert fused and all(f.evidence["wall_saving_s"] < 0 for f in fused)
    assert all("cost the host more" in f.message for f in fused)
    assert all(f.severity == Severity.INFO < f.gpu_severity for f in fused)
    graphs = _finding(report, "launch-bound")
    assert graphs.evidence["wall_saving_s"] > 0  # a CUDA graph removes what binds the step
    graph_mode = _audit("resnet50", "graph", batch=2)
    assert not any(f.rule == "launch-bound" and f.est_saving_s for f in graph_mode.findings)


def test_unknown_mode_is_an_error():
    model, inputs = create_model("resnet50", batch=1)
    with pytest.raises(GpushapeError, match="unknown mode 'jit'"):
        gpushape.audit(model, inputs, mode="jit")


def test_cli_mode(capsys):
    from gpushape.cli.main import main

    assert main(["audit", "gpt2", "--gpu", "h200", "--batch", "2", "--mode", "compile"]) == 0
    assert "compile:" in capsys.readouterr().out


def test_a_misaligned_convolution_still_pays_under_compile():
    import torch.nn as nn

    model = nn.Sequential(nn.Conv2d(64, 63, 3, padding=1), nn.ReLU(), nn.Conv2d(63, 64, 3))
    x = torch.empty(32, 64, 56, 56, device="meta").contiguous(memory_format=torch.channels_last)
    model = model.to(memory_format=torch.channels_last)
    report = gpushape.audit(model, (x,), gpu="h200", train=True, mode="compile")
    convs = [f for f in report.findings if f.rule == "tc-align"]
    assert convs and not any("under torch.compile" in f.message for f in convs)


def test_the_table_shows_the_wall_clock_saving_where_it_differs_from_the_gpus():
    from gpushape.auditing.report.render import saving_text

    report = _audit("resnet50", "eager", batch=2)  # host-bound: GPU savings hidden
    fused = next(f for f in report.findings if f.rule == "unfused-norm-act")
    text = saving_text(fused, report.totals.roofline_time_s)
    assert text.startswith(f"{fused.est_saving_s * 1e3:,.3f} ms (")
    assert f", wall {fused.evidence['wall_saving_s'] * 1e3:,.3f} ms" in text
    gpu_bound = _audit("resnet50", "eager", batch=256)
    layout = next(f for f in gpu_bound.findings if f.rule == "nchw-conv")
    assert layout.evidence["wall_saving_s"] == pytest.approx(layout.est_saving_s)
    assert "wall" not in saving_text(layout, gpu_bound.totals.roofline_time_s)


def _convnet(*convs: tuple[int, int, int, int]):
    """A stack of (in, out, kernel, groups) convolutions with ReLUs, traced for training."""
    import torch.nn as nn

    layers = []
    for cin, cout, k, groups in convs:
        layers += [nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups), nn.ReLU()]
    model = nn.Sequential(*layers).to("meta")
    x = torch.empty(8, convs[0][0], 28, 28, device="meta")
    return model, x


@pytest.mark.parametrize(
    ("convs", "converts", "why"),
    [
        (((128, 128, 3, 1), (128, 128, 1, 1)), True, "layout optimization"),
        (((128, 128, 3, 1), (128, 128, 3, 128)), True, "layout optimization"),  # depthwise
        (((128, 128, 3, 1), (128, 128, 3, 4)), False, "more than one input channel per group"),
        (((256, 256, 3, 1), (256, 96, 3, 1)), False, "fewer than half as many outputs"),
        (((32, 64, 3, 1), (64, 64, 3, 1)), False, "64 channels or fewer"),
    ],
)
def test_inductor_layout_optimization_follows_its_heuristic(convs, converts, why):
    from gpushape.auditing.modes import inductor_layout_opt

    model, x = _convnet(*convs)
    got, reason = inductor_layout_opt(gpushape.trace(model, (x,), train=True))
    assert got is converts and why in reason


def test_nchw_conv_saves_nothing_under_compile_where_inductor_converts_the_layout():
    """MobileNetV3 on the H200, compiled: its channels_last rewrite changed the GPU's time by
    0.02 of 6.4 ms a step, where the audit had promised 14.8 ms (loop-lib.csv)."""
    model, x = _convnet((128, 128, 3, 1), (128, 128, 3, 1))
    x = torch.empty(64, 128, 56, 56, device="meta")
    eager = gpushape.audit(model, (x,), gpu="h200", train=True, mode="eager")
    compiled = gpushape.audit(model, (x,), gpu="h200", train=True, mode="compile")
    assert _finding(eager, "nchw-conv").est_saving_s > 0
    f = _finding(compiled, "nchw-conv")
    assert f.est_saving_s == 0 and f.severity == Severity.INFO
    assert "layout optimization" in f.message


def test_compile_mode_prices_the_hosts_measured_cost_per_kernel(gpt2):
    """A compiled step still issues every kernel from Python: the host side is the kernels at
    the profile's measured rate per kernel of a compiled step, not at a bare launch's."""
    from gpushape.auditing.modes import COMPILED_KERNEL
    from gpushape.hardware import calibrated, get_gpu

    spec = calibrated(get_gpu("h200"))
    per_kernel = spec.achievable.host[COMPILED_KERNEL]
    assert per_kernel > spec.achievable.launch_overhead_s
    compiled = gpt2["compile"]
    assert compiled.step.host_s == pytest.approx(compiled.step.kernels * per_kernel)


def test_a_profile_without_a_compiled_kernel_rate_prices_compiled_kernels_at_the_launch():
    """The H200 profile's rate is fitted on timed compiled steps and taken as it is; a probe's
    profile has only eager rates, which do not predict it (an H100 lease: 13.3 us an eager op,
    23-36 us a compiled kernel; the H200's: 7.96 and 46): its kernels cost the bare launch."""
    from gpushape.auditing.modes import COMPILED_KERNEL, compiled_kernel_s
    from gpushape.hardware import calibrated, get_gpu

    h200 = calibrated(get_gpu("h200")).achievable.host
    assert compiled_kernel_s(h200) == h200[COMPILED_KERNEL]  # fitted: taken as it is
    assert compiled_kernel_s({"op": 1e-5, "view": 2e-6}) == 0.0  # a probe's rates
    assert compiled_kernel_s({}) == 0.0  # datasheet numbers


def test_compile_mode_takes_what_inductor_does_off_the_gpu_side(gpt2, monkeypatch):
    """A compiled step runs without what Inductor does by itself (GPT-2 on the H200, compiled:
    24.5 ms of GPU work where its eager kernels were priced at 43.4): the fixes it makes that
    fusion does not cover (the padded vocabulary GEMM, tc-align), the traffic between the ops it
    fuses (pricing/inductor_fusion.py, which covers unfused-norm-act's fix), and its bias
    gradients' column sums at its own rate (pricing/column_sum.py), apart here."""
    from gpushape.auditing import inductor as modes  # where compile mode prices them

    eager, compiled = gpt2["eager"], gpt2["compile"]
    done = [f for f in compiled.findings if f.evidence.get("saving_outside_mode_s")]
    assert {f.rule for f in done} >= {"tc-align", "unfused-norm-act"}
    padding = sum(f.evidence["saving_outside_mode_s"] for f in done if f.fix == "pad-channels")
    monkeypatch.setattr(modes, "compiled_column_sum_saving_s", lambda ctx: 0.0)
    eager_sums = _audit("gpt2", "compile", batch=8)
    assert compiled.step.gpu_s < eager_sums.step.gpu_s  # GPT-2's 768-wide biases
    monkeypatch.setattr(modes, "compiled_fusion_saving_s", lambda ctx, exclude=(): 0.0)
    unfused = _audit("gpt2", "compile", batch=8)
    assert eager_sums.step.gpu_s < unfused.step.gpu_s  # the fused chains' traffic
    taken = eager.step.gpu_s - unfused.step.gpu_s  # padding and the loss's fused kernels
    assert padding < taken < padding + 0.5 * (eager.step.gpu_s - compiled.step.gpu_s)
    assert gpt2["graph"].step.gpu_s == pytest.approx(eager.step.gpu_s)  # a graph fuses nothing


def test_a_finding_the_measurement_keeps_at_info_is_not_graded_up_by_rounding():
    """wave-quantization stays info where the probe found no wave pattern on the chip; its
    wall saving equals its GPU saving on a GPU-bound step, and float rounding had graded it
    up to medium (timm's Swin-T on the H200)."""
    pytest.importorskip("timm")
    from gpushape.models import resolve_model

    r = resolve_model("timm:swin_tiny_patch4_window7_224")
    report = gpushape.audit(r.model, r.example_inputs, gpu="h200", train=True)
    waves = [f for f in report.findings if f.rule == "wave-quantization"]
    assert waves and all(f.severity == Severity.INFO for f in waves if "probe" in f.evidence)
    assert all("measured on this chip" in f.message for f in waves if "probe" in f.evidence)


def test_compile_mode_traces_convolutions_channels_last_where_inductor_would():
    """Inductor's layout optimization runs a convnet's convolutions channels_last: compile mode
    audits the model so (EfficientNet-B0 compiled on the H200: 10.2 ms of GPU work, priced
    12.1 so and 19.0 in NCHW), and leaves the model as it was."""
    import torch

    import gpushape
    from gpushape.models import create_model

    model, (x,) = create_model("resnet50", batch=8, image_size=64)
    nchw = gpushape.audit(model, (x,), gpu="h200", train=True, mode="compile")
    cl_model = model.to(memory_format=torch.channels_last)  # on meta: a layout only
    cl = gpushape.audit(cl_model, (x.contiguous(memory_format=torch.channels_last),),
                        gpu="h200", train=True, mode="compile")  # fmt: skip
    eager = gpushape.audit(create_model("resnet50", batch=8, image_size=64)[0], (x,),
                           gpu="h200", train=True, mode="eager")  # fmt: skip
    assert nchw.step.gpu_s == pytest.approx(cl.step.gpu_s)
    assert nchw.step.gpu_s < eager.step.gpu_s
    fresh, _ = create_model("resnet50", batch=8, image_size=64)
    gpushape.audit(fresh, (x,), gpu="h200", train=True, mode="compile")
    assert fresh.conv1.weight.is_contiguous()  # the model audited is not converted


def test_launch_bound_under_compile_names_reduce_overhead():
    import gpushape
    from gpushape.models import create_model

    model, (x,) = create_model("resnet50", batch=8, image_size=64)
    report = gpushape.audit(model, (x,), gpu="h200", train=True, mode="compile")
    f = _finding(report, "launch-bound")
    assert report.step.bound == "host" and f.evidence["wall_saving_s"] > 0
    assert "compiled, the host issues the step in" in f.message
    assert 'mode="reduce-overhead"' in f.message


def test_launch_bound_speaks_in_compile_mode_where_only_the_compiled_host_is_slow():
    """Sixteen GEMMs of 23,040 rows (5.0 ms of GPU work a step; the shipped profile prices the
    eager host at 3.3 ms and the compiled host at 5.5): eagerly their GPU work hides the
    dispatch (a host a third shorter, so only the host's spread costs anything), but a compiled
    step's host costs more a kernel (Inductor's wrapper), so compile mode waits on it: the
    finding is high there, low in eager mode and info in graph mode. (The window is narrow:
    at 24,576 rows the compiled step is GPU-bound too.)"""
    layers = [torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(16)]
    model = torch.nn.Sequential(*layers).to(torch.bfloat16)
    x = torch.empty(23040, 1024, device="meta", dtype=torch.bfloat16)
    saving = {}
    for mode, bound in (("eager", "GPU"), ("compile", "host"), ("graph", "GPU")):
        report = gpushape.audit(model, (x,), gpu="h200", train=True, mode=mode)
        f = _finding(report, "launch-bound")
        assert report.step.bound == bound
        saving[mode] = f.evidence.get("wall_saving_s", f.est_saving_s)
        if mode == "compile":
            assert f.severity == Severity.HIGH
            assert 'mode="reduce-overhead"' in f.message
        elif mode == "eager":
            assert f.severity <= Severity.LOW
        else:
            assert f.severity == Severity.INFO and f.est_saving_s == 0
    assert saving["eager"] < 0.1 * saving["compile"]  # an order of magnitude apart


def test_the_wall_clock_is_the_longer_side_with_the_hosts_spread():
    from gpushape.auditing.modes import HOST_SPREAD, StepTime, wall_clock_s

    assert wall_clock_s(0.010, 0.001) == pytest.approx(0.010)  # far apart: the longer one
    assert wall_clock_s(0.001, 0.010) == pytest.approx(0.010)
    assert wall_clock_s(0.010, 0.0) == 0.010 and wall_clock_s(0.010, 0.010, 0.0) == 0.010
    even = wall_clock_s(0.010, 0.010)  # where they meet: up to 12% more at a spread of 0.3
    assert 0.010 < even < 0.0113 and HOST_SPREAD == 0.3
    # a GPU saving on a step predicted slightly host-bound still saves part of its time
    before, after = wall_clock_s(0.0318, 0.0348), wall_clock_s(0.0272, 0.0348)
    assert 0.2 * 0.0046 < before - after < 0.0046
    assert StepTime(mode="eager", gpu_s=0.0318, host_s=0.0348).wall_s == before


def test_the_gpu_idles_between_its_kernels_as_the_profile_measured():
    """A step's GPU side is its kernels' busy time plus the idle time between them, at the
    profile's rate for the mode; a profile without it counts none."""
    from gpushape.auditing.modes import StepTime, compile_graphs_step, device_gap_s
    from gpushape.hardware import calibrated, get_gpu
    from gpushape.hardware.profile import apply_profile

    step = StepTime(mode="compile", gpu_s=0.020, host_s=0.001, kernels=500, idle_s=0.0015)
    assert step.wall_s == pytest.approx(0.0215)  # GPU-bound: kernels, then the gaps
    bare = get_gpu("h100")  # the datasheet (a spec given calibrated is taken as it is)
    assert device_gap_s(bare, "compile") == 0.0
    rows = {"eager": 2e-6, "compile": 3e-6, "graph": 0.4e-6, "compile-graphs": 1e-6}
    profile = {"device_gap": {k: {"seconds": v, "steps": 5} for k, v in rows.items()}}
    gpu = apply_profile(bare, profile)
    assert {k: device_gap_s(gpu, k) for k in rows} == pytest.approx(rows)
    model, inputs = create_model("bert-base", batch=1)
    compiled = gpushape.audit(model, inputs, gpu=gpu, train=True, mode="compile").step
    assert compiled.idle_s == pytest.approx(compiled.kernels * 3e-6)
    graph = gpushape.audit(model, inputs, gpu=gpu, train=True, mode="graph").step
    assert graph.idle_s == pytest.approx(graph.kernels * 0.4e-6)
    replayed = compile_graphs_step(compiled, graph, gpu)  # reduce-overhead: compiled kernels
    assert replayed.gpu_s == compiled.gpu_s and replayed.kernels == compiled.kernels
    assert replayed.idle_s == pytest.approx(compiled.kernels * 1e-6)
    assert replayed.host_s == graph.host_s
    # a fit that found a time a step too ("step_seconds") adds it once, whatever the kernels
    stepped = {"compile": {"seconds": 0.3e-6, "step_seconds": 1e-3, "steps": 5}}
    timed = gpushape.audit(model, inputs, gpu=apply_profile(bare, {"device_gap": stepped}),
                           train=True, mode="compile").step  # fmt: skip
    assert timed.idle_s == pytest.approx(timed.kernels * 0.3e-6 + 1e-3)
    shipped = compile_graphs_step(compiled, graph, "h200")  # a name: its shipped profile's
    assert shipped.idle_s == pytest.approx(
        compiled.kernels * device_gap_s(calibrated(get_gpu("h200")), "compile-graphs")
    )


def test_an_eager_step_with_a_measured_idle_gap_is_priced_at_its_wall_clock():
    """Where the profile measured the GPU's idle time between eager kernels, the eager header
    and the share a saving is graded on are the wall clock (kernels and their idle time, or
    the host's side); without it, kernels and launches in series, as before."""
    from gpushape.auditing.modes import predicted_step_s
    from gpushape.hardware import get_gpu
    from gpushape.hardware.profile import apply_profile

    model, inputs = create_model("bert-base", batch=1)
    bare = get_gpu("h100")
    plain = gpushape.audit(model, inputs, gpu=bare, train=True, profile=None)
    assert plain.step.idle_s == 0.0
    assert predicted_step_s(plain) == pytest.approx(
        max(plain.totals.roofline_time_s, plain.step.wall_s)
    )
    profile = {"device_gap": {"eager": {"seconds": 2e-6, "steps": 5}}}
    gpu = apply_profile(bare, profile)
    gapped = gpushape.audit(model, inputs, gpu=gpu, train=True)
    step = gapped.step
    assert step.idle_s == pytest.approx(step.kernels * 2e-6) and step.idle_s > 0
    assert predicted_step_s(gapped) == pytest.approx(step.wall_s)
    assert predicted_step_s(gapped) < gapped.totals.roofline_time_s  # the series overstates
    # shares are of the traced step's wall clock too, shorter than the series
    graded = [
        f for f in gapped.findings
        if f.est_saving_s and "share_of_step" in f.evidence
        and "saving_by_mode_s" not in f.evidence and f.fix != "cuda-graphs"
    ]  # fmt: skip
    assert graded
    for f in graded:
        basis = f.est_saving_s / f.evidence["share_of_step"]
        assert basis == pytest.approx(step.wall_s, rel=1e-3)  # no optimizer: the same step
        assert basis < gapped.totals.roofline_time_s
