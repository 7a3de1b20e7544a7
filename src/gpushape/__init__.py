"""gpushape: make PyTorch networks fit the GPU they run on.

    import gpushape
    report = gpushape.audit(model, inputs, gpu="h200")   # findings, layers, totals
    t = gpushape.trace(model, inputs, train=True)        # a gpushape.tracing.Trace
    costs = gpushape.cost(t, "h200")                     # a gpushape.tracing.CostReport

These functions are the front door, with `gpushape.optimize(model, inputs)` (apply the fixes)
and `gpushape.align(n)` (a size the tensor cores like). The packages behind them: `hardware`
(what the chip is), `tracing` (what the model does), `auditing` (what is wrong), `transforms`
(what to change), `kernels` (fused ops), `data` (input pipeline), `probe` (measuring the chip),
`bench` (timing), `models` and `cli`. Importing `gpushape` loads no torch.
"""

__version__ = "0.1.0"


def trace(model, example_inputs, train=False, device=None, *, name=None):
    """Trace `model` on `example_inputs` (meta device by default): `gpushape.tracing.Trace`.

    See `gpushape.tracing.tracer.trace` for the arguments.
    """
    from .tracing.tracer import trace as _trace

    return _trace(model, example_inputs, train=train, device=device, name=name)


def cost(trace, gpu, *, math=None):
    """Cost every op of a Trace on `gpu` (GPUSpec or name): `gpushape.tracing.CostReport`.

    See `gpushape.tracing.cost.cost` for the math modes.
    """
    from .tracing.cost import cost as _cost

    return _cost(trace, gpu, math=math)


def audit(
    model,
    example_inputs,
    gpu=None,
    dtype="bf16",
    train=True,
    optimizer=None,
    dataloader=None,
    **options,
):
    """Audit `model` for `gpu`: `gpushape.auditing.report.Report` (.findings, .layers, .totals,
    .to_json(), .to_markdown(), .to_html(path)). `gpu` is a catalog name; None (default) is the
    CUDA GPU present when the catalog has it, else h100. `dtype` is a torch dtype or "bf16"/
    "fp16"/"fp32" (default bf16); see `gpushape.auditing.api.audit` for the rest.
    """
    from .auditing.api import audit as _audit

    return _audit(
        model,
        example_inputs,
        gpu,
        dtype=_dtype(dtype),
        train=train,
        optimizer=optimizer,
        dataloader=dataloader,
        **options,
    )


def optimize(
    model,
    example_inputs,
    gpu=None,
    train=True,
    dtype="bf16",
    mode="eager",
    memory_budget=None,
    transforms=None,
    **options,
):
    """Apply the audit's fixes to `model` in place and check them numerically:
    `(model, gpushape.transforms.OptimizeReport)`. See `gpushape.transforms.optimize`;
    `gpushape.transforms.revert(model)` undoes it.
    """
    from .transforms import optimize as _optimize

    return _optimize(
        model,
        example_inputs,
        gpu,
        train=train,
        dtype=_dtype(dtype),
        mode=mode,
        memory_budget=memory_budget,
        transforms=transforms,
        **options,
    )


def align(n, kind="gemm", gpu=None, dtype="bf16"):
    """The smallest size >= n that the chip's tensor cores take at full speed (vocabularies,
    hidden sizes, channels: "gemm", "vocab", "conv", "heads"). See
    `gpushape.hardware.align`."""
    from .hardware import align as _align

    return _align(n, kind, gpu, dtype)


def _dtype(dtype):
    """A torch dtype, or one named "bf16", "fp16" or "fp32"."""
    import torch

    from .errors import GpushapeError

    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if not isinstance(dtype, str):
        return dtype
    if dtype not in names:
        raise GpushapeError(f"unknown dtype {dtype!r}; known: {', '.join(names)}")
    return names[dtype]
