"""Price an optimizer's step: run it on meta stand-ins and count what its kernels move.

A meta copy of the optimizer (same class, same hyperparameters, parameters and gradients as
meta tensors, so nothing is computed or allocated) takes two steps; the second, in steady
state, is recorded op by op. For each op: bytes = every tensor read once, plus the tensors it
writes (outputs, or the first tensor list of an in-place op); kernels = 1, a multi-tensor
(foreach) op launching once per device and dtype group. The fused alternative reads every
parameter, gradient and state tensor once and writes parameters and states once, in one launch
per group. On the GPU, `foreach=None` means the foreach implementation (PyTorch's default for
CUDA tensors), so the copy is stepped with foreach=True where the original would be.

A step's GPU time (`step_gpu_s`) is its bytes at the rate the profile fitted for its kernels,
plus a time per parameter tensor per kernel: multi-tensor kernels give each tensor blocks of its
own and split long lists into several launches, so a convnet's many small tensors cost more
than their bytes.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .host import FOREACH_HOST


@dataclass(frozen=True)
class StepCost:
    implementation: str  # "for-loop", "foreach", "fused"
    kernels: int
    bytes_moved: int
    parameters: int  # parameter tensors


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func.is_view or all(t.numel() <= 1 for t in tensors):
            return out  # scalars (step counts live on the CPU unless capturable): no kernel
        reads = sum(_nbytes(t) for t in {id(t): t for t in tensors}.values() if t.numel() > 1)
        if name.endswith("_"):  # in place: writes its first argument (a tensor or a list)
            first = args[0] if args else None
            written = first if isinstance(first, (list, tuple)) else [first]
        else:
            written = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.bytes += reads + sum(_nbytes(t) for t in written if isinstance(t, torch.Tensor))
        self.kernels += 1
        return out


def implementation(optimizer: torch.optim.Optimizer) -> str:
    groups = optimizer.param_groups
    if groups and all(g.get("fused") for g in groups):
        return "fused"
    if any(g.get("foreach") is False for g in groups):
        return "for-loop"
    if any("foreach" in g for g in groups):
        return "foreach"  # foreach=None: PyTorch's default for CUDA tensors
    return "for-loop"


def supports(optimizer: torch.optim.Optimizer, option: str) -> bool:
    return option in inspect.signature(type(optimizer).__init__).parameters


# options the meta copy leaves out: the implementation (chosen by the caller), and capturable,
# which keeps the step count on the device and refuses meta tensors (an AssertionError that left
# the step unpriced: the optimizer of a step captured in a CUDA graph, which `make_capturable`
# rebuilds so, cost nothing, and a whole-step graph of BERT-base and GPT-2 on an H100 was
# predicted to save their fused AdamW's 0.7-0.8 ms on the GPU, where it saved 0.1,
# benchmarks/results/loops-h100-34). Its bytes and kernels are the same; its step count's
# scalar ops are no kernels here either way.
_NOT_ON_META = ("params", "fused", "foreach", "capturable")


def _meta_copy(optimizer: torch.optim.Optimizer, foreach: bool) -> torch.optim.Optimizer:
    groups = []
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            meta = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"))
            meta.grad = torch.empty_like(meta)
            params.append(meta)
        options = {k: v for k, v in group.items() if k not in _NOT_ON_META}
        groups.append({"params": params, **options})
    extra = {"foreach": foreach} if supports(optimizer, "foreach") else {}
    return type(optimizer)(groups, **extra)


def current_step(optimizer: torch.optim.Optimizer) -> StepCost:
    """The step as `optimizer` takes it: a fused one's single pass (`fused_step`), else its
    ops counted on a meta copy (which steps for-loop or foreach: no meta fused kernel)."""
    impl = implementation(optimizer)
    if impl == "fused":
        return fused_step(optimizer)
    copy = _meta_copy(optimizer, foreach=impl == "foreach")
    copy.step()  # creates the state
    with _Counter() as counter:
        copy.step()
    n = sum(len(g["params"]) for g in copy.param_groups)
    return StepCost(impl, counter.kernels, counter.bytes, n)


def _stepped_state(optimizer: torch.optim.Optimizer):
    copy = _meta_copy(optimizer, foreach=False)
    copy.step()
    params = [p for g in copy.param_groups for p in g["params"]]
    state = [
        t
        for p in params
        for t in copy.state[p].values()
        if isinstance(t, torch.Tensor) and t.numel() > 1
    ]
    return copy, params, state


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state once it has stepped (Adam: two moments per parameter)."""
    return sum(_nbytes(t) for t in _stepped_state(optimizer)[2])


def fused_step(optimizer: torch.optim.Optimizer) -> StepCost:
    """One pass: read parameters, gradients and state; write parameters and state."""
    copy, params, state = _stepped_state(optimizer)
    read = sum(_nbytes(p) * 2 for p in params) + sum(_nbytes(t) for t in state)
    written = sum(_nbytes(p) for p in params) + sum(_nbytes(t) for t in state)
    groups = {(p.dtype, p.device) for p in params}
    return StepCost("fused", len(groups) * len(copy.param_groups), read + written, len(params))


def step_gpu_s(step: StepCost, optimizer: Any, gpu: Any) -> float:
    """GPU seconds of an optimizer step: its bytes at the copy rate, where the profile fitted
    its implementation's multi-tensor kernels (`Achievable.optimizer_kernels`, by class where
    fitted for it: fused AdamW and fused SGD run differently) at their efficiency, plus each
    parameter tensor's share of each kernel. On an H100 (benchmarks/steps/
    fit_optimizer_kernels.py) a foreach step of EfficientNet-B0's 213 tensors ran 124 us of
    kernels for 28 us of bytes, ViT-B/16's 152 larger ones 554 for 460."""
    rates = getattr(gpu.achievable, "optimizer_kernels", None) or {}
    return kernels_priced_s(step, type(optimizer).__name__, rates,
                            gpu.attainable_bandwidth_bytes_per_s())  # fmt: skip


def kernels_priced_s(
    step: StepCost, cls: str, rates: Mapping[str, float], bandwidth: float
) -> float:
    """`step_gpu_s` from the flattened rates (`Achievable.optimizer_kernels`'s form) of an
    optimizer class `cls`: also what the fits check their rows with (probe/workloads/)."""
    impl = step.implementation
    if impl == "for-loop" or not rates:
        return step.bytes_moved / bandwidth
    key = f"{impl}/{cls}"
    efficiency = rates.get(key, rates.get(impl, 1.0))
    per_tensor = rates.get(f"{key}/tensor", rates.get(f"{impl}/tensor", 0.0))
    return step.bytes_moved / (bandwidth * efficiency) + per_tensor * step.parameters * step.kernels


def foreach_host_s(optimizer: Any, rates: Mapping[str, Any] | None) -> float:
    """Host seconds a foreach step spends beyond the fused one (its per-tensor Python: bias
    corrections and step sizes as lists of floats): parameter tensors x the profile's rate for
    the optimizer's class (0.0 for other implementations, or where the profile has no rate).
    Hugging Face GPT-2 with AdamW on the H200: its eager step issued 3.6 ms faster once the
    optimizer was fused, on two leases, for 148 tensors."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not rates:
        return 0.0
    if implementation(optimizer) != "foreach":
        return 0.0
    entry = rates.get(f"{FOREACH_HOST}/{type(optimizer).__name__}", rates.get(FOREACH_HOST))
    if entry is None:
        return 0.0
    per_tensor = float(entry["seconds"] if isinstance(entry, Mapping) else entry)
    return per_tensor * sum(len(g["params"]) for g in optimizer.param_groups)
