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


# As with trace: the audit package is imported first, so that `gpushape.audit` names the
# function below; the package is `gpushape.audit` in import statements
# (`from gpushape.audit import Finding, register_rule`).
from . import audit as _audit_package  # noqa: E402, F401


def audit(model, example_inputs, gpu="h100", dtype="bf16", train=True, optimizer=None,
          dataloader=None, **options):
    """Audit `model` for `gpu`: `gpushape.audit.report.Report` (.findings, .layers, .totals,
    .to_json(), .to_markdown(), .to_html(path)). `dtype` is a torch dtype or "bf16"/"fp16"/
    "fp32" (default bf16); see `gpushape.audit.api.audit` for the rest.
    """
    import torch

    from .audit.api import audit as _audit
    from .errors import GpushapeError

    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if isinstance(dtype, str):
        if dtype not in names:
            raise GpushapeError(f"unknown dtype {dtype!r}; known: {', '.join(names)}")
        dtype = names[dtype]
    return _audit(model, example_inputs, gpu, dtype=dtype, train=train, optimizer=optimizer,
                  dataloader=dataloader, **options)
