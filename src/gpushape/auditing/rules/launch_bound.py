"""launch-bound: many ops each far shorter than a kernel launch; CUDA graphs would hide them.

Eager PyTorch launches every kernel from the CPU. The GPU runs them as fast as they arrive, so
a step takes the longer of two times: the GPU's (the sum of kernel times) and the CPU's (the
kernels x the eager launch overhead, or where the profile measured the host's rates the
host model's whole dispatch: tracing/host.py); a CUDA graph replays the same kernels at the
graph launch overhead. Saving (wall_clock_s: the longer of the two, the host's known to within
a spread, modes.py):
    wall(gpu_s, host_s) - wall(gpu_s, kernels x graph_launch_s)
which is kernels x (eager - graph overhead) when the step is launch-bound through and through,
and zero when the GPU work hides the launches. Both overheads come from the GPUSpec (measured
on the H200: 6.9 us eager, 1.1 us replayed). A step whose GPU work hides its eager launches may
still wait on the host compiled (Inductor's wrapper issues every kernel from Python, at a
compiled step's measured host cost per kernel: modes.py): then the finding is priced for
compile mode only (torch.compile's reduce-overhead mode) and is info in the others. That case
is judged on the compiled step without the fusions Inductor makes (more GPU work than it will
run), so it speaks only where the compiled host is the longer side even then; the wall-clock
saving the report shows is the compiled step's with them (modes.py).

A whole-step graph costs memory: it holds what the step allocates in a pool of its own, which
the rest of the program cannot reuse. In 21 timed training loops (timm and Hugging Face models,
H100 and H200) the peak grew under reduce-overhead by 0.4-1.1x the activations the audit
estimates are kept for backward (pricing/memory.py; MobileNetV3 1.24 -> 2.63 GB, ResNet-50 at
batch 256 11.1 -> 24.3), and under gpushape's eager whole-step graph by up to 1.5x. A training
step's finding says so, and warns where the estimate would pass what the chip can hold.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..context import AuditContext
from ..finding import Finding
from ..modes import host_spread, step_time, wall_clock_s
from ..pricing.memory import training_memory
from ..registry import register_rule
from .checkpoint_candidate import MEMORY_PRESSURE  # past it of the chip's memory: a warning

RULE = "launch-bound"


def graph_memory(ctx: AuditContext) -> tuple[str, dict]:
    """What a whole-step graph adds to a training step's peak memory (module docstring): the
    sentence the finding ends with, and its evidence; nothing for inference."""
    if not ctx.train:
        return "", {}
    memory = training_memory(ctx)
    extra = memory.activation_bytes
    if extra <= 0:
        return "", {}
    evidence = {"graph_pool_bytes": extra, "training_memory_bytes": memory.total_bytes}
    sentence = (
        f"; the graph keeps the step's memory in a pool of its own: expect the peak to grow "
        f"by about the activations kept for backward, {extra / 1e9:,.1f} GB"
    )
    if memory.total_bytes + extra > MEMORY_PRESSURE * ctx.gpu.memory_bytes:
        sentence += (
            f", to about {(memory.total_bytes + extra) / 1e9:,.0f} GB of the "
            f"{ctx.gpu.memory_bytes / 1e9:,.0f} GB this GPU has: it may not fit"
        )
    return sentence, evidence


@register_rule(RULE, title="kernels shorter than their launch: use CUDA graphs")
def check(ctx: AuditContext) -> Iterable[Finding]:
    ops = [c for c in ctx.cost.ops if c.kernels > 0]
    kernels = sum(c.kernels for c in ops)
    if not kernels:
        return
    achievable = ctx.gpu.achievable
    gpu_s = sum(c.kernel_time_s for c in ops)
    eager_s = kernels * achievable.launch_overhead_s
    graph_s = kernels * achievable.graph_launch_overhead_s
    # the host's whole dispatch where the profile measured its rates (tracing/host.py): the
    # Python, autograd and library set-up around the launches, which a graph skips as well
    host_s = max(step_time(ctx, "eager").host_s, eager_s)
    spread = host_spread(ctx.gpu)
    saving_s = wall_clock_s(gpu_s, host_s, spread) - wall_clock_s(gpu_s, graph_s, spread)
    # compiled, Inductor's wrapper issues each kernel from Python (modes.py): a step whose GPU
    # work hides the eager launches can still wait on the compiled host
    compiled = step_time(ctx, "compile")
    replayed_s = compiled.kernels * achievable.graph_launch_overhead_s
    compiled_s = compiled.wall_s - wall_clock_s(compiled.gpu_s, replayed_s, spread)
    if saving_s <= 0 and compiled_s <= 0:
        return
    short = sum(
        c.kernels for c in ops if c.kernel_time_s / c.kernels < achievable.launch_overhead_s
    )
    evidence = {
        "kernels": kernels,
        "kernels_shorter_than_launch": short,
        "gpu_time_s": gpu_s,
        "eager_launch_time_s": eager_s,
        "eager_host_time_s": host_s,
        "graph_launch_time_s": graph_s,
        "launch_overhead_s": achievable.launch_overhead_s,
        "graph_launch_overhead_s": achievable.graph_launch_overhead_s,
    }
    dispatch = (
        f"the host takes {host_s * 1e3:,.2f} ms to issue the eager step ({kernels} kernels, "
        f"{eager_s * 1e3:,.2f} ms of it their launches)"
        if host_s > eager_s
        else f"{kernels} kernels take {eager_s * 1e3:,.2f} ms to launch eagerly"
    )
    pace = (
        "the CPU sets the pace"
        if host_s > gpu_s
        else "close enough that the host, which varies from machine to machine, holds the GPU "
        "up at times"
    )
    message = (
        f"{dispatch} against {gpu_s * 1e3:,.2f} ms of GPU work ({short} kernels are shorter "
        f"than their launch): {pace}; a CUDA graph launches them in {graph_s * 1e3:,.2f} ms"
    )
    if saving_s <= 0:  # it pays only compiled: quiet in the other modes
        evidence["saving_by_mode_s"] = {"eager": 0.0, "compile": compiled_s, "graph": 0.0}
        evidence["why_quiet"] = {
            "eager": "the eager step's GPU work hides its launches",
            "graph": "the step already runs from a CUDA graph",
        }
        message = (
            f"{kernels} kernels a step: eagerly the GPU's work ({gpu_s * 1e3:,.2f} ms) hides "
            f"their dispatch ({host_s * 1e3:,.2f} ms)"
        )
        saving_s = compiled_s
    note, memory = graph_memory(ctx)
    evidence.update(memory)
    yield ctx.finding(
        RULE,
        "",
        message + note,
        evidence,
        saving_s=saving_s,
        fix="cuda-graphs",
        replaces=ctx.trace.ops,  # a CUDA graph relaunches every kernel of the step
    )
