"""What the model does: trace it once (no memory, no compute) and cost every op on a GPU.

    import gpushape
    from gpushape.tracing import TensorSpec
    t = gpushape.trace(model, (TensorSpec((8, 3, 224, 224), torch.bfloat16),), train=True)
    report = gpushape.cost(t, "h100", math="bf16")       # a CostReport

Files: tracer.py (`trace`), recorder.py (the dispatch-mode recorder and module attribution),
records.py (`Trace`, `OpRecord`, `TensorMeta`), inputs.py (`TensorSpec`, meta stand-ins),
routing.py (SDPA and dropout routed to the fused kernels CUDA runs, on meta), flops/ (FLOPs
and minimum bytes per op family), gemm_model.py (GEMM efficiency), families.py and layout.py
(memory families and NCHW conversions), cost.py (`cost`, `CostReport`, `OpCost`).

The names below load on first use, so `import gpushape` stays free of torch. `cost` is not
among them (it would clash with the `cost` submodule): use `gpushape.cost` or
`from gpushape.tracing.cost import cost`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "trace": "tracer",
    "TraceError": "recorder",
    "TensorSpec": "inputs",
    "Trace": "records",
    "OpRecord": "records",
    "TensorMeta": "records",
    "CostReport": "cost",
    "OpCost": "cost",
    "CostTotals": "cost",
    "ModuleCost": "cost",
    "register_formula": "flops.registry",
    "OpWork": "flops.registry",
    "Gemm": "flops.registry",
    "gemm_efficiency": "gemm_model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpushape.tracing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
