"""How a benchmark variant's step is compiled and run: torch.compile with a variant's Inductor
options, Dynamo's recompile limit while several compiled variants of one model are built,
Inductor's CUDA graphs stepped once a training step, and cuDNN's algorithm search switched on
for one variant alone (`variants.py` names the parts, builds and uses these)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

COMPILE_RUNNERS = ("compile", "compile-max-autotune", "compile-graphs")


def inductor_options(spec: Any) -> dict[str, bool]:
    """The Inductor options a variant's compile options name."""
    options = {}
    if spec.aten_random:
        options["fallback_random"] = True
    if spec.tuned_kernels:
        options["coordinate_descent_tuning"] = True
    return options


def compiled(model: nn.Module, mode: str | None, extra: dict[str, bool]) -> Any:
    """torch.compile of `model` in `mode`; with `extra` Inductor options, the mode's options
    plus those (torch.compile takes a mode or options, not both)."""
    if not extra:
        return torch.compile(model, mode=mode)
    from torch._inductor import list_mode_options

    options = dict(list_mode_options(mode)) if mode else {}
    options.update(extra)
    return torch.compile(model, options=options)


@contextlib.contextmanager
def cudnn_benchmark(on: bool) -> Iterator[None]:
    """torch.backends.cudnn.benchmark set to `on` inside, as it was after."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on or before
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def with_cudnn_benchmark(run: Any) -> Any:
    def step() -> Any:
        with cudnn_benchmark(True):
            return run()

    return step


def is_compiled(spec: Any) -> bool:
    """Whether the variant runs its model under torch.compile."""
    return (spec.compile_first or spec.runner) in COMPILE_RUNNERS


@contextlib.contextmanager
def room_to_compile(specs: Iterable[Any], builds_each: int = 1) -> Iterator[None]:
    """Dynamo's recompile limit raised, while these variants are built and run, to its own
    allowance for each compiled build. Dynamo keeps one cache of compiled code per Python
    function, shared by every instance of a module class: each variant of one model, a loop's
    every stage, adds its entries to the same `forward`'s cache (a rewritten structure, a grad
    mode, a compile mode). At the limit (8) Dynamo stops compiling that function and runs it
    eagerly from then on, with a one-line warning: a loop's sixth compiled stage of a
    LLaMA-style decoder was timed eager (919 kernels a step where its stage before ran 274, 12
    ms slower). `builds_each`: how often each variant is built (twice where a loss check
    trains it first)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    allowance = int(getattr(config, name))
    builds = sum(is_compiled(s) for s in specs) * builds_each
    if builds <= 1:
        yield
        return
    with config.patch({name: allowance * (builds + 1)}):
        yield


def each_step_graphed(compiled: Any) -> Any:
    """A reduce-overhead compiled model whose every call starts a new step of Inductor's CUDA
    graphs (`cudagraph_mark_step_begin`), as training loops must: each step's outputs may
    then be overwritten by the next step's replay, never within one."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args, **kwargs)

    return forward
