"""`room_to_compile`: Dynamo's recompile limit raised while one model's compiled variants are
built, so none of them silently runs eager (Dynamo's cache is per function, shared by every
instance of a module class)."""

from __future__ import annotations

import torch
from torch import nn

from gpushape.steps.compiling import is_compiled, room_to_compile
from gpushape.steps.variants import Spec

LIMIT = torch._dynamo.config.recompile_limit


class Scaled(nn.Module):
    """Each instance's `k` is a constant Dynamo guards on: a new instance, a new cache entry of
    the one `forward`, as each rewritten stage of a model is."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


def _compiles(instances: int) -> int:
    """How many of `instances` distinct Scaled modules Dynamo compiled (the rest ran eager)."""
    frames: list[int] = []

    def backend(gm, example_inputs):
        frames.append(1)
        return gm.forward

    torch._dynamo.reset()
    x = torch.ones(3)
    for k in range(instances):
        compiled = torch.compile(Scaled(k + 2), backend=backend)
        assert torch.equal(compiled(x), x * (k + 2))  # eager or compiled, the same numbers
    torch._dynamo.reset()
    return len(frames)


def test_without_room_the_ninth_variant_runs_eager():
    assert _compiles(LIMIT + 3) == LIMIT  # what happened to a loop's sixth LLaMA stage


def test_with_room_every_variant_compiles():
    specs = [Spec(runner="compile")] * 4
    with room_to_compile(specs, builds_each=2):
        assert torch._dynamo.config.recompile_limit == LIMIT * 9
        assert _compiles(LIMIT + 3) == LIMIT + 3
    assert torch._dynamo.config.recompile_limit == LIMIT  # restored


def test_room_counts_only_compiled_variants():
    assert is_compiled(Spec(runner="compile-graphs"))
    assert is_compiled(Spec(runner="graph", compile_first="compile"))
    assert not is_compiled(Spec(runner="graph")) and not is_compiled(Spec())
    with room_to_compile([Spec(), Spec(runner="graph"), Spec(runner="compile")]):
        assert torch._dynamo.config.recompile_limit == LIMIT  # one compiled build: no change
    with room_to_compile([Spec(runner="compile"), Spec(runner="compile-max-autotune")]):
        assert torch._dynamo.config.recompile_limit == LIMIT * 3
