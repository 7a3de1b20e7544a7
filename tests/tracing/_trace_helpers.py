"""Small helpers for the trace tests: trace a function of tensors, pick ops by name."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import gpushape
from gpushape.tracing.flops.registry import OpWork, op_work
from gpushape.tracing.records import OpRecord, Trace


class Fn(nn.Module):
    """A module whose forward is `fn(*inputs, *params)`; params become nn.Parameters."""

    def __init__(self, fn: Callable, *params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList(nn.Parameter(p) for p in params)

    def forward(self, *inputs):
        return self.fn(*inputs, *self.params)


def trace_fn(
    fn: Callable, inputs: tuple, params: tuple = (), *, train: bool = False, device=None
) -> Trace:
    return gpushape.trace(Fn(fn, *params), inputs, train=train, device=device)


def meta(*shape: int, dtype=torch.float32, requires_grad=False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def ops_named(trace: Trace, name: str) -> list[OpRecord]:
    """Compute ops whose short name ('convolution') is `name`."""
    return [op for op in trace.ops if op.name == name]


def only(trace: Trace, name: str) -> OpRecord:
    found = ops_named(trace, name)
    assert len(found) == 1, f"expected one {name}, found {[o.op for o in trace.ops]}"
    return found[0]


def work(rec: OpRecord) -> OpWork:
    return op_work(rec)


def nbytes(*shape: int, itemsize: int = 4) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * itemsize
