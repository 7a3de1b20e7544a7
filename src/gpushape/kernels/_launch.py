"""A kernel launch with Triton's per-call JIT dispatch skipped once the kernel is compiled.

Host cost matters for fused ops: Triton's JIT dispatch (argument specialisation, cache lookup)
costs tens of microseconds per launch, as much as a small kernel runs. `Launch` goes through the
JIT on its first call, then calls the compiled kernel's launcher directly while the arguments
keep the 16-byte alignment Triton specialised on. A Triton whose launcher takes other arguments
turns the direct path off for the process (`FAST_LAUNCH`), and every launch goes through the JIT.
"""

from __future__ import annotations

import torch

FAST_LAUNCH = True


def aligned(*tensors: torch.Tensor | None) -> bool:
    """Every given tensor (None skipped) starts 16-byte aligned (what Triton specialises on)."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits & 15 == 0


class Launch:
    """One kernel with its grid and constexprs fixed."""

    __slots__ = ("consts", "grid", "kernel", "meta", "runner")

    def __init__(self, kernel, grid: int | tuple[int, ...], meta: dict):
        self.kernel, self.meta = kernel, meta
        self.grid = (grid,) if isinstance(grid, int) else tuple(grid)
        self.consts: tuple = ()
        self.runner = None

    def __call__(self, is_aligned: bool, *args) -> None:
        global FAST_LAUNCH
        runner = self.runner
        if runner is not None and is_aligned and FAST_LAUNCH:
            try:
                runner(*args, *self.consts)
                return
            except (TypeError, ValueError, IndexError):  # a launcher that takes other arguments
                FAST_LAUNCH = False
        compiled = self.kernel[self.grid](*args, **self.meta)
        if hasattr(compiled, "result"):  # a Triton that compiles asynchronously
            compiled = compiled.result()
        if runner is None and is_aligned and hasattr(compiled, "__getitem__"):
            # Since Triton 3.3 the compiled launcher takes every parameter, constexprs last in
            # signature order, and a three-dimensional grid.
            self.consts = tuple(self.meta[name] for name in self.kernel.arg_names[len(args) :])
            self.runner = compiled[self.grid + (1,) * (3 - len(self.grid))]
