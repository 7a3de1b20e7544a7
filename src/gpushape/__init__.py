"""gpushape: make PyTorch networks fit the GPU they run on."""

__version__ = "0.1.0"

# The trace package loads torch only when used. It is imported here first so that the
# functions below, not the package, are what `gpushape.trace` names (importing a submodule
# binds its name in the parent package only the first time). Its contents:
# `from gpushape.trace import Trace, OpRecord, TensorSpec, CostReport`.
from . import trace as _trace_package  # noqa: F401


def trace(model, example_inputs, train=False, device=None, *, name=None):
    """Trace `model` on `example_inputs` (meta device by default): `gpushape.trace.Trace`.

    See `gpushape.trace.tracer.trace` for the arguments.
    """
    from .trace.tracer import trace as _trace

    return _trace(model, example_inputs, train=train, device=device, name=name)


def cost(trace, gpu, *, math=None):
    """Cost every op of a Trace on `gpu` (GPUSpec or name): `gpushape.trace.CostReport`.

    See `gpushape.trace.cost.cost` for the math modes.
    """
    from .trace.cost import cost as _cost

    return _cost(trace, gpu, math=math)
