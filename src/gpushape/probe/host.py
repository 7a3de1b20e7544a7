"""The host's rates for an eager training step: what one op, view, backward op and module call
cost the CPU (seconds each), as `tracing/host.py` prices a traced step.

Each is a loop of many calls on tiny tensors, so the GPU's work is negligible and the time is
the host's: PyTorch's Python binding, the dispatcher, autograd's recording, a library's
per-call setup (cuDNN's descriptors and heuristics, cuBLAS's), the launch. Per op class
(`op`: elementwise; `gemm`, `conv`, `grouped_conv` (depthwise), `batch_norm`, `layer_norm`,
`attention`, and gpushape's own fused ops, on CUDA only: `gpushape`, as its BatchNormAct2d,
`gpushape_norm`, its row norms, as AddLayerNorm, and `gpushape_group_norm`, as GroupNormAct):
a chain
y = f(y) of calls on a tensor that needs a gradient, in bf16 on CUDA: the forward's seconds per
link, and its backward's (`backward_op`, `<class>/backward`: the engine runs one node a link;
the chain's forward not timed). `view`: `x.view(-1)`; `module`: an `nn.Module` whose forward
returns its input, called, less the same plain function called (what `Module.__call__` adds);
`accumulate_grad`: the backward's node per gradient leaf; `optimizer_foreach_tensor/<class>`
(AdamW, SGD; on CUDA by default): what a foreach step costs the host beyond the fused one, per
parameter tensor. The Python a real module's forward runs beyond its ops (`module_glue`) is
fitted on real models: probe/host_glue.py.
Medians over `repeats` runs after a warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CALLS = 2000


class _Pass(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _pass(x: torch.Tensor) -> torch.Tensor:
    return x


def _median_s(run: Callable[[], Any], device: torch.device, repeats: int) -> float:
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _chains(dev: torch.device, dtype: torch.dtype) -> dict[str, tuple[Callable, str]]:
    """Per op class: (one link of a chain, y -> f(y) keeping the shape, its description)."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def param(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.1).to(dev, dtype).requires_grad_()

    w_lin, w_conv, w_dw = param(16, 16), param(8, 8, 3, 3), param(8, 1, 3, 3)
    with torch.no_grad():  # near identity: values stay O(1) down a long chain (no denormals)
        w_lin.add_(torch.eye(16, device=dev, dtype=dtype))
        w_conv.mul_(0.1).add_(nn.init.dirac_(torch.empty(8, 8, 3, 3)).to(dev, dtype))
        w_dw.mul_(0.1).add_(nn.init.dirac_(torch.empty(8, 1, 3, 3), groups=8).to(dev, dtype))
    bn_w, bn_b, ln_w, ln_b = param(8), param(8), param(16), param(16)
    running = (torch.zeros(8, device=dev, dtype=dtype), torch.ones(8, device=dev, dtype=dtype))
    return {
        "op": (lambda y: y * 1.0001, "y * 1.0001"),
        "gemm": (lambda y: F.linear(y, w_lin), "F.linear on 4x16, weight 16x16"),
        "conv": (lambda y: F.conv2d(y, w_conv, padding=1), "F.conv2d 3x3 on 2x8x4x4"),
        "grouped_conv": (
            lambda y: F.conv2d(y, w_dw, padding=1, groups=8),
            "F.conv2d 3x3 depthwise (groups 8) on 2x8x4x4",
        ),
        "batch_norm": (
            lambda y: F.batch_norm(y, *running, bn_w, bn_b, training=True),
            "F.batch_norm, training, on 2x8x4x4",
        ),
        "layer_norm": (lambda y: F.layer_norm(y, (16,), ln_w, ln_b), "F.layer_norm on 4x16"),
        "attention": (
            lambda y: F.scaled_dot_product_attention(y, y, y),
            "F.scaled_dot_product_attention on 1x2x8x16",
        ),
        "gpushape": (
            _gpushape_link(dev, dtype) if dev.type == "cuda" else (lambda y: y),
            "gpushape's BatchNormAct2d (training, ReLU) on 2x8x4x4 channels_last, per traced op",
        ),
        "gpushape_norm": (
            _norm_link(dev, dtype) if dev.type == "cuda" else (lambda y: y),
            "gpushape's AddLayerNorm on 4x16 (the sum's input twice)",
        ),
        "gpushape_group_norm": (
            _group_norm_link(dev, dtype) if dev.type == "cuda" else (lambda y: y),
            "gpushape's GroupNormAct(4, 8, ReLU) on 2x8x4x4",
        ),
    }


SHAPES = {
    "conv": (2, 8, 4, 4),
    "grouped_conv": (2, 8, 4, 4),
    "batch_norm": (2, 8, 4, 4),
    "attention": (1, 2, 8, 16),
    "gpushape": (2, 8, 4, 4),
    "gpushape_group_norm": (2, 8, 4, 4),
}
# Traced ops a link makes: gpushape's batch_norm_act traces as two forward ops (statistics,
# apply) and one backward op; every other link as one each way.
TRACED = {"gpushape": (2, 1)}


def _gpushape_link(dev: torch.device, dtype: torch.dtype) -> Callable:
    from ..kernels import BatchNormAct2d

    bn = BatchNormAct2d(8).to(dev, dtype)
    return lambda y: bn(y.contiguous(memory_format=torch.channels_last))


def _group_norm_link(dev: torch.device, dtype: torch.dtype) -> Callable:
    from ..kernels import GroupNormAct

    return GroupNormAct(4, 8, activation="relu").to(dev, dtype)


def _norm_link(dev: torch.device, dtype: torch.dtype) -> Callable:
    from ..kernels import AddLayerNorm

    norm = AddLayerNorm(16).to(dev, dtype)
    return lambda y: norm(y, y)[0]


def _chain_rates(link: Callable, x: torch.Tensor, calls: int, repeats: int) -> tuple[float, float]:
    """(forward seconds a link, backward seconds a link) of a chain of `calls` links."""
    dev = x.device
    fwd, bwd = [], []
    for i in range(repeats + 1):
        _sync(dev)
        t0 = time.perf_counter()
        y = x
        for _ in range(calls):
            y = link(y)
        t1 = time.perf_counter()
        _sync(dev)
        t2 = time.perf_counter()
        y.float().sum().backward()
        _sync(dev)
        t3 = time.perf_counter()
        x.grad = None
        if i:
            fwd.append(t1 - t0)
            bwd.append(t3 - t2)
    return statistics.median(fwd) / calls, statistics.median(bwd) / calls


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure_host(
    device: str = "cuda", *, calls: int = CALLS, repeats: int = 5, classes: Any = None
) -> dict[str, Any]:
    """{"op": {"seconds": ..., "workload": ...}, "backward_op": ..., "view": ..., "module": ...,
    and per op class "gemm", "gemm/backward", "conv", ...}: seconds a call. `classes`: the op
    classes to measure (default: all on CUDA; on a CPU, where the host is the device and
    convolutions crawl, only "op")."""
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.ones(1, device=dev, requires_grad=True)

    def views() -> None:
        for _ in range(calls):
            x.view(-1)

    module, plain = _Pass(), _pass

    def modules() -> None:
        for _ in range(calls):
            module(x)

    def functions() -> None:
        for _ in range(calls):
            plain(x)

    out: dict[str, Any] = {}
    links = max(calls // 10, 20)  # deep chains of real ops: shorter
    if classes is None:
        classes = None if dev.type == "cuda" else ("op",)  # gpushape's ops: CUDA only
    for name, (link, what) in _chains(dev, dtype).items():
        if classes is not None and name not in classes:
            continue
        shape = SHAPES.get(name, (4, 16))
        start = torch.randn(*shape, device=dev, dtype=dtype).requires_grad_()
        n = calls if name == "op" else links
        try:
            _chain_rates(link, start, 3, 1)  # warm-up: kernels' first calls, heuristics
            fwd, bwd = _chain_rates(link, start, n, repeats)
        except Exception as exc:  # a class this device cannot run falls back to "op"
            out[f"{name}/error"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        back = "backward_op" if name == "op" else f"{name}/backward"
        per_fwd, per_bwd = TRACED.get(name, (1, 1))
        out[name] = {
            "seconds": fwd / per_fwd, "workload": f"{what}, needing a gradient", "calls": n
        }  # fmt: skip
        out[back] = {
            "seconds": bwd / per_bwd, "workload": f"backward of a chain of {what}", "calls": n
        }  # fmt: skip
    out["view"] = {
        "seconds": _median_s(views, dev, repeats) / calls, "workload": "x.view(-1)",
        "calls": calls,
    }  # fmt: skip
    extra = _median_s(modules, dev, repeats) - _median_s(functions, dev, repeats)
    out["module"] = {
        "seconds": max(extra, 0.0) / calls,
        "workload": "nn.Module returning its input, less a plain function",
        "calls": calls,
    }
    if classes is None or "optimizer" in classes:
        out.update(_optimizer_rates(dev, dtype, repeats))
    if dev.type == "cuda" and (classes is None or "graph_layer" in classes):
        out.update(_graph_layer_rates(dev, dtype, repeats))
    out["accumulate_grad"] = {
        "seconds": _accumulate_rate(dev, dtype, links, repeats),
        "workload": f"backward of torch.stack of {links} leaf tensors, less of {links // 4}, "
        "a leaf",
        "calls": links,
    }
    return out


def _accumulate_rate(dev: torch.device, dtype: torch.dtype, leaves: int, repeats: int) -> float:
    """Seconds autograd's engine spends handing one leaf its gradient (an AccumulateGrad node,
    the gradient stolen, as a parameter's from its GEMM's backward): the backward of
    `torch.stack(leaves).sum()` at two numbers of leaves, the difference per leaf (one
    StackBackward node either way; its per-leaf view is counted in)."""

    def backward_s(n: int) -> float:
        ps = [torch.zeros(4, 16, device=dev, dtype=dtype, requires_grad=True) for _ in range(n)]
        times = []
        for i in range(repeats + 1):
            loss = torch.stack(ps).float().sum()
            for p in ps:
                p.grad = None
            _sync(dev)
            t0 = time.perf_counter()
            loss.backward()
            _sync(dev)
            if i:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    few = max(leaves // 4, 1)
    return max(backward_s(leaves) - backward_s(few), 0.0) / (leaves - few)


# a foreach optimizer step against the fused one: tensors of a small model's sizes (GPT-2's
# 148 average 0.84M numbers), so the multi-tensor kernels launch chunk by chunk as they do there
OPTIMIZER_TENSORS = (64, 1 << 20)
OPTIMIZERS = {
    "AdamW": (torch.optim.AdamW, {"lr": 1e-4}),
    "SGD": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
}


def _optimizer_rates(dev: torch.device, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """`optimizer_foreach_tensor/<class>`: seconds per parameter tensor a foreach step costs
    the host beyond the fused step (tracing/optimizer_step.py), each step issued with
    the GPU held busy so that the host never waits on it."""
    from ..tracing.host import FOREACH_HOST

    n, numel = OPTIMIZER_TENSORS if dev.type == "cuda" else (OPTIMIZER_TENSORS[0], 64)
    params = [torch.zeros(numel, device=dev, dtype=dtype, requires_grad=True) for _ in range(n)]
    for p in params:
        p.grad = torch.zeros_like(p)
    out: dict[str, Any] = {}
    for name, (cls, options) in OPTIMIZERS.items():
        try:
            seconds = {impl: _step_s(cls(params, **options, **{impl: True}), dev, repeats)
                       for impl in ("foreach", "fused")}  # fmt: skip
        except Exception as exc:  # an implementation this device lacks
            out[f"{FOREACH_HOST}/{name}/error"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        out[f"{FOREACH_HOST}/{name}"] = {
            "seconds": max(seconds["foreach"] - seconds["fused"], 0.0) / n,
            "workload": f"{name}.step() foreach less fused, {n} tensors of {numel} numbers, "
            "a tensor",
            "calls": n,
        }
    return out


def _step_s(optimizer: torch.optim.Optimizer, dev: torch.device, repeats: int) -> float:
    from ..bench.timer import hold_gpu

    for _ in range(3):  # the state, and the kernels' first calls
        optimizer.step()
    times = []
    for _ in range(repeats):
        _sync(dev)
        if dev.type == "cuda":
            hold_gpu(0.05)
        t0 = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    _sync(dev)
    return statistics.median(times)


# graph-layers' replay (transforms/graph_layers.py): a chain of this many layers, each captured
# by torch.cuda.make_graphed_callables, with 1 and with 4 Linear(16, 16) in it
GRAPH_CHAIN = 24
GRAPH_LINEARS = (1, 4)


def _graph_layer_rates(dev: torch.device, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """`graph_layer`: host seconds one layer replayed from CUDA graphs costs for its forward
    and backward (two graph launches, the copies into the graphs' static inputs, the autograd
    function around them, its gradients' detaches), less its parameter tensors' share,
    `graph_layer_param` (per parameter tensor). A chain of `GRAPH_CHAIN` graphed layers on a
    4x16 tensor, forward and backward issued with the GPU held busy, at two sizes of layer. On
    a lent H100 a profiled MobileNetV3 step spent about 0.5 ms of host a graphed block."""
    from ..bench.timer import hold_gpu

    def chain_s(linears: int) -> float:
        layers = tuple(
            nn.Sequential(*(nn.Linear(16, 16) for _ in range(linears))).to(dev, dtype)
            for _ in range(GRAPH_CHAIN)
        )
        samples = tuple(
            (torch.randn(4, 16, device=dev, dtype=dtype, requires_grad=True),) for _ in layers
        )
        graphed = torch.cuda.make_graphed_callables(layers, samples)
        x = torch.randn(4, 16, device=dev, dtype=dtype, requires_grad=True)
        times = []
        for i in range(repeats + 2):
            _sync(dev)
            hold_gpu(0.05)
            t0 = time.perf_counter()
            y = x
            for layer in graphed:
                y = layer(y)
            torch.autograd.backward(y, torch.ones_like(y))
            if i > 1:  # two warm-up steps
                times.append(time.perf_counter() - t0)
        _sync(dev)
        return statistics.median(times) / GRAPH_CHAIN

    try:
        small, large = (chain_s(n) for n in GRAPH_LINEARS)
    except Exception as exc:  # no CUDA graphs here
        return {"graph_layer/error": {"error": f"{type(exc).__name__}: {exc}"[:200]}}
    params = tuple(2 * n for n in GRAPH_LINEARS)  # weight and bias of each Linear
    per_param = max(large - small, 0.0) / (params[1] - params[0])
    what = f"a chain of {GRAPH_CHAIN} layers of {{}} Linear(16, 16) replayed from CUDA graphs"
    return {
        "graph_layer": {
            "seconds": max(small - per_param * params[0], 0.0),
            "workload": what.format(GRAPH_LINEARS[0]) + ", forward and backward, a layer, "
            "less its parameters' share",
            "calls": GRAPH_CHAIN,
        },
        "graph_layer_param": {
            "seconds": per_param,
            "workload": what.format(f"{GRAPH_LINEARS[0]} and {GRAPH_LINEARS[1]}")
            + ": the difference per parameter tensor",
            "calls": GRAPH_CHAIN,
        },
    }
