"""Linear bias gradients by a cuBLAS GEMV, inside what graph-layers captures.

A Linear's bias gradient is the column sum of its output gradient, `grad.sum(0)` over every
token. PyTorch takes it with a generic reduction kernel that, on an H200, reads a 16,384 x 768
bf16 gradient at about a quarter of the copy rate; cuBLAS does the same sum as a GEMV against
a vector of ones at two thirds of it, in fp32 accumulation like the reduction
(`benchmarks/kernels/probe_bias_grad.py`, GPU time from CUDA graphs). BERT-base has six Linears
with biases a layer.

Only inside graphed layers: there the host's cost of a Python autograd.Function (its forward,
and its backward in autograd's worker thread) is not paid on replay, and the saving is the GPU's
alone. `gemv_bias_grads()` is a torch function mode active while graph-layers captures: every
`F.linear` with a 16-bit bias that needs its gradient, over inputs of at least `MIN_ROWS` rows
and outputs of at most `MAX_OUT` features (where the GEMV measured faster), runs as
`_LinearGemvBias`. Its forward is `F.linear` (the same kernel); its backward computes the input
and weight gradients with the same two GEMMs PyTorch's addmm backward runs, and the bias
gradient with the GEMV. Modules, parameters and the state_dict are untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

MIN_ROWS = 1024  # a GEMV over fewer rows saves too little to matter
MAX_OUT = 8192  # wider outputs (a vocabulary) measured no faster as a GEMV
DTYPES = (torch.bfloat16, torch.float16)


class _LinearGemvBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (g @ weight).reshape(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            dw = g.t() @ x.reshape(-1, x.shape[-1])
        if ctx.needs_input_grad[2]:
            db = g.new_ones(g.shape[0]) @ g
        return dx, dw, db


def linear_gemv_bias(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight, bias)` whose bias gradient is a GEMV against ones."""
    return _LinearGemvBias.apply(x, weight, bias)


def takes(x: object, weight: object, bias: object) -> bool:
    """Whether this F.linear call is one the GEMV bias gradient is for."""
    return (
        isinstance(x, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and isinstance(bias, torch.Tensor)
        and type(x) is torch.Tensor
        and bias.requires_grad
        and torch.is_grad_enabled()
        and x.dim() >= 2
        and bias.dtype in DTYPES
        and x.dtype == weight.dtype == bias.dtype
        and x.numel() // max(x.shape[-1], 1) >= MIN_ROWS
        and weight.shape[0] <= MAX_OUT
    )


class gemv_bias_grads(TorchFunctionMode):
    """While active, qualifying `F.linear` calls run as `linear_gemv_bias`; `weights` holds
    the ids of the weights whose Linears it rerouted. `only`: reroute those weights' Linears
    alone (the ones graph-layers rerouted, when a whole step is captured around them)."""

    def __init__(self, only: set[int] | None = None) -> None:
        super().__init__()
        self.weights: set[int] = set()
        self.only = only

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = _linear_args(args, kwargs)
            if takes(x, weight, bias) and (self.only is None or id(weight) in self.only):
                self.weights.add(id(weight))
                return linear_gemv_bias(x, weight, bias)
        return func(*args, **kwargs)


def _linear_args(args: tuple, kwargs: dict) -> tuple:
    names = ("input", "weight", "bias")
    values = list(args) + [None] * (3 - len(args))
    for i, name in enumerate(names):
        if name in kwargs:
            values[i] = kwargs[name]
    return tuple(values[:3])
