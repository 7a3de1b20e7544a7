"""How the model will run: eager, torch.compile, or replayed from a CUDA graph.

The same fix is worth different things in each mode, and advice must hold in the mode the user
runs:
- eager: every op is dispatched from Python. When the host takes longer than the GPU's work
  (`StepTime.bound == "host"`), a fix that shortens the GPU's work does not shorten the step:
  each finding says the wall-clock time it saves beside the GPU time, counting what the fix
  does to the host's dispatch (host_effect.py), and is graded by that wall-clock time.
- compile: Inductor pads misaligned matmuls and fuses normalizations, softmax and dropout with
  their elementwise neighbours by itself, and a cross-entropy over the logits into two
  kernels (pricing/loss.py: the traced loss priced as those). Findings whose fix it already
  makes are kept as info with a saving of zero and say so (measured on the H200: GPT-2's
  vocabulary padding saved 11.7 ms a step eager but 0.5 ms compiled,
  `benchmarks/results/baselines-h200/compile_vocab_pad.json`; gpushape's fused BatchNorm
  gained 0.99x under torch.compile, `e2e_rn50_kernels.json` there).
- graph: the step is replayed from a CUDA graph (or torch.compile's reduce-overhead mode):
  launches cost the graph's overhead, and launch-bound's fix is already made.
The host side is the longer of the cost model's launch count times the measured launch
overhead and, where the profile measured the host's rates, its dispatch of every traced op,
view, module call (with the Python of its forward) and gradient leaf in eager mode
(tracing/host.py); in compile mode each kernel at what a compiled step's host was measured to
spend per kernel (Inductor's wrapper still issues every kernel from Python). The GPU side
counts the optimizer's step too (its bytes, `AuditContext.optimizer_gpu_s`), which the timed
step runs after the backward; the host side counts its foreach Python in eager mode (in
compile mode the compiled host rate carries it; fusing the optimizer saves it in both, since
torch.compile leaves optimizer.step eager).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GpushapeError
from ..tracing.host import host_cost
from ..tracing.optimizer_step import foreach_host_s
from .context import AuditContext
from .finding import TIME_SHARE_THRESHOLDS, Finding, Severity, severity_for_share
from .host_effect import host_saving_s
from .inductor import (  # noqa: F401  (compile mode's parts, imported from here too)
    COMPILE_DOES,
    FUSED_FIXES,
    about_convolution,
    compiled_gpu_saving_s,
    compiled_kernels,
    inductor_does,
    inductor_layout_opt,
)

MODES = ("eager", "compile", "graph")
# host seconds per kernel of a compiled step, where the profile measured it (26-63 us over 23
# compiled steps on several H200 leases, median 41 over the 18 not waiting on the GPU:
# benchmarks/steps/fit_compile_host.py, kernels counted as pricing/inductor_kernels.py counts
# them; the wrapper's buffer allocations and
# launcher calls, ATen for extern kernels, autograd for the compiled backward, the optimizer's
# step)
COMPILED_KERNEL = "compiled_kernel"
# A profile with the host's eager op rate but no compiled-kernel rate (a probe's: that rate is
# fitted on timed compiled steps, which the probe does not run) prices a compiled kernel at the
# bare launch. The op rate does not predict it: the H200's hosts ran 7.96 us an eager op and
# 46 us a compiled kernel; an H100 lease's probe measured 13.3 us an op, and its compiled ViT-B
# and LLaMA-style steps issued 23 and 36 us a kernel (benchmarks/results/loops-h100-7: scaled
# as on the H200, 77 us, predicted both steps host-bound by 2x and promised 25 and 12 ms from
# CUDA graphs, which saved 0.4 and -0.5).
GRAPH_DOES = {"cuda-graphs": "the step already runs from a CUDA graph"}
GRAPH_CANNOT: dict[str, str] = {}  # fix -> why a CUDA graph cannot replay its rewritten step
# fixes to what runs after the traced forward and backward (the optimizer's step): what they
# save comes off the wall clock whichever side binds the traced step
OUTSIDE_STEP = {"fused-optimizer"}
# the host side's spread: a log-normal's sigma. The same model's eager step issued up to 2.2x
# faster on one lent H200 host than on another, and a compiled step's host per kernel spread
# 26-63 us over 23 steps (median 41): about +-35% (results-h200.md, "The host model")
HOST_SPREAD = 0.3
SLOWER_WALL = 0.5  # say so when a fix saves less than this share of its GPU time in wall time


def wall_clock_s(gpu_s: float, host_s: float, spread: float = HOST_SPREAD) -> float:
    """A step's wall clock: the longer of its GPU time and its host time, the host's known only
    to within `spread` (the sigma of a log-normal whose mean is `host_s`), so the expected
    longer of the two. Far from each other it is the longer one; where they meet it is up to
    12% more than either (the queue between them runs dry now and then), and a fix that
    shortens the GPU's side of a step predicted slightly host-bound still saves some of its
    time, as measured (BERT compiled on the H200: its masked-LM head took 4.6 ms off the GPU
    and 2.3 ms off a step whose host was predicted 1.5 ms longer than its GPU)."""
    if spread <= 0 or gpu_s <= 0 or host_s <= 0:
        return max(gpu_s, host_s)
    z = (math.log(gpu_s / host_s) + spread * spread / 2) / spread
    return gpu_s * _phi(z) + host_s * _phi(spread - z)


def _phi(x: float) -> float:
    """The standard normal's cumulative distribution."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise GpushapeError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    return mode


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """The step's predicted time in a mode: GPU work, host launches, and the wall clock."""

    mode: str
    gpu_s: float
    host_s: float
    """Kernels x the launch overhead of the mode (eager's, or a CUDA graph's)."""
    kernels: int = 0
    """The kernels the host issues a step in this mode."""
    spread: float = HOST_SPREAD
    """The host side's spread (`host_spread`)."""
    idle_s: float = 0.0
    """The GPU's idle time between its kernels while the host keeps it fed: kernels x the
    profile's device gap for the mode (`device_gap_s`). A GPU-bound step's wall clock is its
    kernels' busy time plus this (on the H200, 1-3 us a kernel issued one by one and well
    under 1 us replayed from a whole-step CUDA graph)."""

    @property
    def wall_s(self) -> float:
        return wall_clock_s(self.gpu_s + self.idle_s, self.host_s, self.spread)

    @property
    def bound(self) -> str:
        return "host" if self.host_s > self.gpu_s + self.idle_s else "GPU"

    def text(self) -> str:
        idle = f" (+{self.idle_s * 1e3:,.3f} idle between kernels)" if self.idle_s else ""
        return (
            f"{self.mode}: {self.bound}-bound, {self.gpu_s * 1e3:,.3f} ms on the GPU{idle}, "
            f"{self.host_s * 1e3:,.3f} ms on the host"
        )


def compiled_stage(given: StepTime, stage: StepTime) -> StepTime:
    """A rewritten model's compiled step, from the step as given: the rewritten model's GPU
    work, and the given host less the kernels the rewrites removed (or plus those they added)
    at the given step's host cost per kernel: over 14 compiled rewrites that removed 90-193
    kernels (Swin-T's sdpa in five runs, BERT's fuse-qkv and skip-attention-mask, the
    LLaMA-style decoder's fuse-qkv; benchmarks/results/loops-*), the issue time fell by 8-44
    us a kernel, median 28, where the H100 profile's compiled average is 27."""
    if not given.kernels:
        return stage
    per_kernel = given.host_s / given.kernels
    host_s = max(given.host_s - (given.kernels - stage.kernels) * per_kernel, 0.0)
    return dataclasses.replace(stage, host_s=host_s)


def compile_graphs_step(
    compiled: StepTime,
    graph: StepTime,
    gpu: Any,
    gpu_s: float | None = None,
    boundary_bytes: int = 0,
) -> StepTime:
    """torch.compile's CUDA graphs (mode="reduce-overhead"): the compiled step's GPU work (or
    `gpu_s`) and kernels, launched as graph mode launches them, idling as those graphs do, plus
    the copies into the graphs' static inputs of what reaches them from outside the step
    (`Trace.boundary_bytes`, read and written: on an H100 a Hugging Face decoder's logits'
    zero gradient, 0.4-0.6 ms a step, benchmarks/results/loops-h100-25). `gpu`: a GPUSpec, or
    what `audit` takes."""
    if not hasattr(gpu, "achievable"):
        from .target import resolve_target

        gpu = resolve_target(gpu).spec
    idle = device_idle_s(gpu, "compile-graphs", compiled.kernels)
    gpu_s = compiled.gpu_s if gpu_s is None else gpu_s
    gpu_s += 2 * boundary_bytes / gpu.attainable_bandwidth_bytes_per_s()
    return dataclasses.replace(graph, gpu_s=gpu_s, kernels=compiled.kernels, idle_s=idle)


def predicted_step_s(report: Any) -> float:
    """A report's predicted step, as its header shows it: the wall clock of its mode, the GPU's
    work and idle time or the host's side, whichever is longer. Eager, where the profile has
    no measured idle time between kernels (the datasheet's numbers): kernels and launches in
    series, or the host's dispatch where that is longer."""
    step = getattr(report, "step", None)
    if step is None:
        return report.totals.roofline_time_s
    if step.mode == "eager" and not step.idle_s:
        return max(report.totals.roofline_time_s, step.wall_s)
    return step.wall_s


def traced_step_s(ctx: AuditContext) -> float:
    """The traced step (forward and backward, no optimizer) as it runs eagerly: its kernels'
    GPU time plus the GPU's idle time between them, or the host's launches and dispatch where
    those take longer, where the profile measured that idle time (`device_gap_s`); else its
    kernels and launches in series. The series overstates a timed step: of six library
    models' eager training steps timed on the H200 (benchmarks/results/bench-h200,
    loop-*-eager.json), it priced five at 1.07-1.27x their measured time and the wall clock
    at 0.94-1.02x (Swin-T, whose step waits on the GPU, at 0.64 and 0.53)."""
    if device_gap_s(ctx.gpu, "eager") <= 0:
        return ctx.cost.totals.roofline_time_s
    return step_time(ctx, "eager", optimizer=False).wall_s


def device_gap_s(gpu: Any, kind: str) -> float:
    """Seconds the GPU idles between two kernels of a step run as `kind` ("eager", "compile",
    "graph", "compile-graphs"), or at a boundary between two CUDA graphs' replays
    ("graph_replay", probe/memory.py), where the profile measured it; else 0."""
    return float((getattr(gpu.achievable, "device_gap", None) or {}).get(kind, 0.0))


def device_idle_s(gpu: Any, kind: str, kernels: int) -> float:
    """Seconds the GPU idles in one step of `kernels` kernels run as `kind`: a gap a kernel,
    and where the profile's fit found one, a time a step (`"<kind>/step"`: on an H100 a
    compiled step idled 1.1-1.4 ms whatever its kernels, benchmarks/steps/fit_device_gap.py)."""
    step = (getattr(gpu.achievable, "device_gap", None) or {}).get(kind + "/step", 0.0)
    return kernels * device_gap_s(gpu, kind) + float(step)


def compiled_kernel_s(rates) -> float:
    """Host seconds a kernel of a compiled step costs: the profile's fitted rate, else 0 (the
    step's kernels priced at the bare launch: see `COMPILED_KERNEL`)."""
    return float(rates.get(COMPILED_KERNEL, 0.0))


def step_time(
    ctx: AuditContext, mode: str, findings: Sequence[Finding] = (), *, optimizer: bool = True
) -> StepTime:
    """The step in `mode`. Eager: the host's side is the longer of the kernels' launches and,
    where the profile measured the host's rates, its dispatch of every op, view and module call
    (tracing/host.py); graph mode: the graph's launches; compile mode: each kernel at the
    host's measured cost per kernel of a compiled step (`COMPILED_KERNEL`), else a launch, and
    the GPU's side less what Inductor does by itself (`compiled_gpu_saving_s`; of `findings`,
    the rules' findings before `in_mode`). Compiled on the H200, nine models' GPU work was
    predicted at 0.88-1.09 of what it measured (benchmarks/steps/check_compiled_gpu.py).
    `optimizer=False`: the traced step alone, without the optimizer's step on either side."""
    totals, achievable = ctx.cost.totals, ctx.gpu.achievable
    # what the step runs in this mode beyond the eager trace (transformers' all-true mask under
    # compile and capture: materialized-attention-mask), so a fix of it is priced on that step
    gpu_s = totals.kernel_time_s + sum(
        float(f.evidence.get("cost_in_mode_s", {}).get(mode, 0.0)) for f in findings
    )
    if optimizer:  # the optimizer's step, after the backward on the GPU's queue
        gpu_s += ctx.optimizer_gpu_s
    if mode == "compile":
        gpu_s = max(gpu_s - compiled_gpu_saving_s(ctx, findings), 0.0)
    per_launch = (
        achievable.graph_launch_overhead_s if mode == "graph" else achievable.launch_overhead_s
    )
    if mode == "compile":  # Inductor's wrapper issues each kernel from Python: measured
        per_launch = max(per_launch, compiled_kernel_s(achievable.host or {}))
    kernels = compiled_kernels(ctx.trace, ctx.cost) if mode == "compile" else totals.kernels
    host_s = kernels * per_launch
    if mode == "eager":
        dispatch = host_cost(ctx.trace, ctx.gpu)
        if dispatch is not None:  # the optimizer's foreach Python on top of forward, backward
            foreach_s = foreach_host_s(ctx.optimizer, achievable.host) if optimizer else 0.0
            host_s = max(host_s, dispatch.seconds + foreach_s)
    return StepTime(mode=mode, gpu_s=gpu_s, host_s=host_s, kernels=kernels,
                    spread=host_spread(ctx.gpu),
                    idle_s=device_idle_s(ctx.gpu, mode, kernels))  # fmt: skip


def host_spread(gpu: Any) -> float:
    """The host side's spread for this chip's rates: the profile's, else `HOST_SPREAD`."""
    spread = getattr(gpu.achievable, "host_spread", None)
    return HOST_SPREAD if spread is None else float(spread)


def wall_saving_s(f: Finding, step: StepTime, ctx: AuditContext) -> float:
    """What a fix saves of the wall-clock step: its GPU saving where the GPU sets the pace,
    and in an eager step what it does to the host's dispatch too (auditing/host_effect.py:
    negative where the fix dispatches more than it replaces and the host then sets the pace);
    a CUDA graph removes the launches instead."""
    if f.fix == "cuda-graphs":
        graph = step_time(ctx, "graph")
        if step.mode == "compile":  # mode="reduce-overhead" replays the compiled kernels
            graph = compile_graphs_step(step, graph, ctx.gpu, None, ctx.trace.boundary_bytes)
        # the finding prices the launches a graph saves; the GPU's idle time between kernels
        # is left as it is (the loop prices a replayed stage's own: steps/fix_by_fix.py)
        graph = dataclasses.replace(graph, idle_s=step.idle_s)
        return max(step.wall_s - graph.wall_s, 0.0)
    if f.fix in OUTSIDE_STEP:
        # torch.compile compiles the model, not optimizer.step: a foreach step's Python runs in
        # compile mode too (its compiled host rate, fitted on whole steps, carries it), and
        # fusing it saves that (re-predicted on the H200's compiled loops: ViT-B/16, GPT-2,
        # ConvNeXt-T, the LLaMA-style model, MobileNetV3, EfficientNet-B0 within 0.5-2x on their
        # hosts, where the GPU's saving alone was 0.02-0.11 of the measured for the timm ones)
        host = host_saving_s(f, ctx) if step.mode in ("eager", "compile") else 0.0
        if not host:
            return f.est_saving_s
        # the optimizer's GPU work is in step_time's GPU side (a finding with a saving was
        # priced from the same step), its foreach Python on the host's side; fused, both shrink
        after = dataclasses.replace(
            step, gpu_s=max(step.gpu_s - f.est_saving_s, 0.0), host_s=max(step.host_s - host, 0.0)
        )
        return step.wall_s - after.wall_s
    host_s = step.host_s
    if step.mode == "eager":
        host_s = max(host_s - host_saving_s(f, ctx), 0.0)
    after = dataclasses.replace(step, gpu_s=max(step.gpu_s - f.est_saving_s, 0.0), host_s=host_s)
    return step.wall_s - after.wall_s


def in_mode(findings: Sequence[Finding], ctx: AuditContext, mode: str) -> list[Finding]:
    """The findings as they hold in `mode`: fixes the mode already makes are info with no
    saving; every time saving gets its wall-clock share (`evidence["wall_saving_s"]`)."""
    step = step_time(ctx, mode, findings)
    done = COMPILE_DOES if mode == "compile" else GRAPH_DOES if mode == "graph" else {}
    out = []
    for f in findings:
        f, quiet = _for_mode(f, ctx, mode)
        if quiet:
            out.append(f)
            continue
        if f.fix in done and f.est_saving_s is not None and not about_convolution(f):
            out.append(_already_done(f, mode, done[f.fix]))
            continue
        if mode == "graph" and f.fix in GRAPH_CANNOT and f.est_saving_s is not None:
            why = GRAPH_CANNOT[f.fix]
            out.append(_info(f, mode, f"in a CUDA graph this fix cannot run: {why}"))
            continue
        if f.est_saving_s is None or f.est_saving_s <= 0:
            out.append(f)
            continue
        wall = wall_saving_s(f, step, ctx)
        message, severity = f.message, f.severity
        if f.fix == "cuda-graphs" and mode == "compile":  # the rule speaks of eager launches
            message += (
                f"; compiled, the host issues the step in {step.host_s * 1e3:,.2f} ms (Inductor's "
                f"wrapper) against {step.gpu_s * 1e3:,.2f} ms of GPU work: torch.compile's "
                'mode="reduce-overhead" replays the compiled kernels from CUDA graphs'
            )
            rate = compiled_kernel_s(ctx.gpu.achievable.host or {})
            if rate and host_spread(ctx.gpu) >= HOST_SPREAD:  # the profile's hosts, not this one
                message += (
                    f" ({step.kernels} kernels at {rate * 1e6:.0f} us each, the profile's hosts; "
                    "hosts differ by up to 2x: `gpushape bench MODEL --optimize --mode compile` "
                    "prices it on yours)"
                )
            # what a CUDA graph saves is wall time, the compiled step's, not the eager launches
            f = dataclasses.replace(f, est_saving_s=wall)
            severity = severity_for_share(wall / step.wall_s if step.wall_s > 0 else None)
        if wall < 0:
            message += (
                f"; but in the {mode} step its ops cost the host more than those they replace, "
                f"and the host then sets the pace: the wall-clock step takes {-wall * 1e3:,.3f} "
                "ms longer"
            )
        elif step.bound == "host" and wall < SLOWER_WALL * f.est_saving_s:
            message += (
                f"; but the {mode} step is host-bound ({step.host_s * 1e3:,.2f} ms on the host "
                f"against {step.gpu_s * 1e3:,.2f} ms on the GPU): this saves GPU time, "
                f"{wall * 1e3:,.3f} ms of the wall-clock step"
            )
        # graded by what the user's step gains, not by the GPU's work it takes away: down
        # where the host hides the GPU saving, up where the fix also spares the host
        share = wall / step.wall_s if step.wall_s > 0 else None
        if wall < SLOWER_WALL * f.est_saving_s:
            severity = min(severity, severity_for_share(share, TIME_SHARE_THRESHOLDS))
        elif wall > f.est_saving_s * (1 + 1e-6):  # the host spared too (not float noise)
            severity = max(severity, severity_for_share(share, TIME_SHARE_THRESHOLDS))
        evidence = {**f.evidence, "wall_saving_s": wall, "mode": mode}
        if severity != f.severity:
            evidence["severity_by_gpu_time"] = f.severity.label
        out.append(dataclasses.replace(f, message=message, evidence=evidence, severity=severity))
    return out


def _for_mode(f: Finding, ctx: AuditContext, mode: str) -> tuple[Finding, bool]:
    """A finding priced per mode (`evidence["saving_by_mode_s"]`: the mode changes what runs)
    with this mode's saving and severity, and whether it is info here (saves nothing; why:
    `evidence["why_quiet"][mode]`)."""
    by_mode = f.evidence.get("saving_by_mode_s")
    if not isinstance(by_mode, dict) or mode not in by_mode:
        return f, False
    saving = float(by_mode[mode])
    if saving <= 0:
        why = f.evidence.get("why_quiet", {}).get(mode, f"nothing changes in {mode} mode")
        return _info(f, mode, f"this saves nothing: {why}"), True
    share = saving / ctx.step_time_s if ctx.step_time_s > 0 else None
    severity = severity_for_share(share, TIME_SHARE_THRESHOLDS)
    return dataclasses.replace(f, est_saving_s=saving, severity=severity), False


def _already_done(f: Finding, mode: str, why: str) -> Finding:
    where = "under torch.compile" if mode == "compile" else "in a CUDA graph"
    return _info(f, mode, f"{where} this saves nothing: {why}")


def _info(f: Finding, mode: str, said: str) -> Finding:
    """`f` as info with no saving in `mode`, saying why."""
    evidence = {**f.evidence, "saving_outside_mode_s": f.est_saving_s, "mode": mode}
    return dataclasses.replace(
        f, severity=Severity.INFO, est_saving_s=0.0, message=f"{f.message}; {said}",
        evidence=evidence,
    )  # fmt: skip
