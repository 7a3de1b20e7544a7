"""The numeric gate of TESTING.md, shared by every kernel test.

A fused kernel passes when its error against a high-precision reference is no worse than a small
multiple of PyTorch's own error at the same dtype:

    max|ours - ref| <= k * max|torch_same_dtype - ref| + tiny,   k = 2 (fp32/fp64), 3 (fp16/bf16)

checked for every output and every input gradient separately, with a random grad_output, and
backed by `torch.testing.assert_close` at fixed tolerances wherever PyTorch itself meets them.
NaN and inf must sit in the same places as in the reference; errors are measured over the finite
positions.

Under TRITON_INTERPRET=1 the interpreter rounds float32 -> bfloat16 by truncation (the GPU rounds
to nearest even), so bfloat16 results there may sit one unit of rounding from PyTorch's; `tiny`
(one unit at the largest magnitude) absorbs that.

Typical use (the reference defaults to `torch_fn` run in float64 on upcast copies of the inputs):

    x = torch.randn(7, 65, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(65, dtype=torch.bfloat16, requires_grad=True)
    gate_forward_backward(my_op, torch_composition, (x, w), names=("x", "w"))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# k of the gate, by dtype of the kernel's output.
GATE_K = {torch.float64: 2.0, torch.float32: 2.0, torch.float16: 3.0, torch.bfloat16: 3.0}

# Backstop (atol, rtol); atol is scaled by max(1, max|ref|): large gradients are judged relatively.
BACKSTOP_TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


@dataclass(frozen=True)
class GateResult:
    name: str
    err_ours: float  # max|ours - ref| over finite positions
    err_torch: float  # max|torch_same_dtype - ref| over finite positions
    bound: float  # k * err_torch + tiny

    @property
    def passed(self) -> bool:
        return self.err_ours <= self.bound


def default_tiny(dtype: torch.dtype, scale: float) -> float:
    """Absolute slack for when PyTorch happens to be (nearly) exact, in units of rounding at the
    largest magnitude (`scale`): one for fp16/bf16; eight for float32, where both errors are a few
    units and the ratio of two maxima over a small tensor swings by ~5x with the random inputs
    alone. In float64 PyTorch's result *is* the reference, so the gate reduces to this slack; it
    allows for a different (but equally good) order of summation.
    """
    if dtype == torch.float64:
        return 1e-12 * scale
    units = 8.0 if dtype == torch.float32 else 1.0
    return units * torch.finfo(dtype).eps * scale


def _scale(ref: torch.Tensor) -> float:
    finite = ref[torch.isfinite(ref)]
    return max(1.0, finite.abs().max().item()) if finite.numel() else 1.0


def max_abs_err(name: str, a: torch.Tensor, ref: torch.Tensor) -> float:
    """max|a - ref| over finite positions, after checking that NaN / inf match the reference."""
    if a.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(a.shape)} != reference {tuple(ref.shape)}")
    a, ref = a.detach().to(torch.float64), ref.detach().to(torch.float64)
    nan_a, nan_r = torch.isnan(a), torch.isnan(ref)
    if not torch.equal(nan_a, nan_r):
        raise AssertionError(
            f"{name}: NaN positions differ from the reference "
            f"({int(nan_a.sum())} vs {int(nan_r.sum())} NaNs)"
        )
    inf_a, inf_r = torch.isinf(a), torch.isinf(ref)
    if not (torch.equal(inf_a, inf_r) and torch.equal(a[inf_a], ref[inf_r])):
        raise AssertionError(f"{name}: inf positions or signs differ from the reference")
    finite = torch.isfinite(ref)
    return (a[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0


def assert_gate(
    name: str,
    ours: torch.Tensor,
    torch_same: torch.Tensor,
    ref: torch.Tensor,
    *,
    k: float | None = None,
    tiny: float | None = None,
    tiny_units: float = 1.0,
    backstop: tuple[float, float] | None = None,
) -> GateResult:
    """Check `ours` against `ref`, allowing k times PyTorch's own error at ours' dtype.
    `tiny_units` scales the default slack (`default_tiny`) where a test says why."""
    dtype = ours.dtype
    k = GATE_K[dtype] if k is None else k
    scale = _scale(ref.detach().to(torch.float64))
    tiny = tiny_units * default_tiny(dtype, scale) if tiny is None else tiny
    err_ours = max_abs_err(name, ours, ref)
    err_torch = max_abs_err(f"{name} (torch, same dtype)", torch_same, ref)
    result = GateResult(name, err_ours, err_torch, k * err_torch + tiny)
    assert result.passed, (
        f"{name} ({dtype}): max|ours - ref| = {err_ours:.3e} exceeds {k:g} x max|torch - ref| "
        f"= {k:g} x {err_torch:.3e} + tiny {tiny:.1e}"
    )
    atol, rtol = BACKSTOP_TOL[dtype] if backstop is None else backstop
    ref64 = ref.detach().to(torch.float64)

    def close(t: torch.Tensor) -> bool:
        return torch.allclose(
            t.detach().to(torch.float64), ref64, atol=atol * scale, rtol=rtol, equal_nan=True
        )

    # The backstop binds wherever PyTorch itself meets it; on an ill-conditioned input (say two
    # nearly equal features, N=2) PyTorch misses it too and the gate above is the judge.
    if close(torch_same):
        torch.testing.assert_close(
            ours.detach().to(torch.float64),
            ref64,
            atol=atol * scale,
            rtol=rtol,
            equal_nan=True,
            msg=lambda m: f"{name} ({dtype}) backstop: {m}",
        )
    return result


def random_grad_like(t: torch.Tensor) -> torch.Tensor:
    """A random grad_output (never ones, never zeros) with t's shape, dtype and device."""
    return torch.randn(t.shape, dtype=t.dtype, device=t.device)


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _fresh(t: Any, dtype: torch.dtype | None = None) -> Any:
    """A detached copy (optionally cast) that requires grad iff the original did."""
    if not isinstance(t, torch.Tensor):
        return t
    copy = t.detach().to(dtype) if dtype is not None and t.is_floating_point() else t.detach()
    return copy.clone().requires_grad_(t.requires_grad)


def outputs_and_grads(
    fn: Callable[..., Any],
    args: Sequence[Any],
    grads_out: Sequence[torch.Tensor] | None = None,
    whole_backward: bool = False,
) -> tuple[tuple[torch.Tensor, ...], list[Any]]:
    """fn(*args)'s outputs (detached) and the gradients of the args that require grad (None
    elsewhere), for grads_out (random when None) cast to each output's dtype. Runs on `args`
    as given: strided views, CUDA-graph static tensors. `whole_backward`: through
    `torch.autograd.backward` without `inputs` (as a training step runs it; the args must be
    leaves without a grad yet), not `torch.autograd.grad`."""
    outs = _as_tuple(fn(*args))
    if grads_out is None:
        grads_out = [random_grad_like(o) for o in outs]
    wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads: list[Any] = [None] * len(args)
    if wanted:
        diff = [(o, g) for o, g in zip(outs, grads_out) if o.requires_grad]
        if whole_backward:
            torch.autograd.backward([o for o, _ in diff], [g.to(o.dtype) for o, g in diff])
            got = [a.grad for a in wanted]
        else:
            got = torch.autograd.grad(
                [o for o, _ in diff], wanted, [g.to(o.dtype) for o, g in diff], allow_unused=True
            )
        it = iter(got)
        grads = [
            next(it) if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args
        ]
    return tuple(o.detach() for o in outs), grads


def _run(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    grads_out: Sequence[torch.Tensor],
    dtype: torch.dtype | None = None,
    whole_backward: bool = False,
) -> tuple[tuple[torch.Tensor, ...], list[Any]]:
    """outputs_and_grads on fresh copies of the inputs, optionally cast to dtype."""
    fresh = [_fresh(t, dtype) for t in inputs]
    return outputs_and_grads(fn, fresh, grads_out, whole_backward)


def gate_forward_backward(
    ours_fn: Callable[..., Any],
    torch_fn: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    names: Sequence[str] | None = None,
    ref_fn: Callable[..., Any] | None = None,
    grad_outputs: Sequence[torch.Tensor] | None = None,
    whole_backward: bool = False,
    **gate_kwargs: Any,
) -> list[GateResult]:
    """Gate every output of `ours_fn(*inputs)` and the gradient of every input that requires grad.

    `torch_fn` is PyTorch's own composition, run at the inputs' dtype; the reference is `ref_fn`
    (default: torch_fn) run on float64 copies. grad_outputs default to random tensors, the same
    values for all three runs. `whole_backward`: as in `outputs_and_grads`. Returns one
    GateResult per checked tensor.
    """
    names = list(names) if names is not None else [f"input{i}" for i in range(len(inputs))]
    ref_fn = torch_fn if ref_fn is None else ref_fn
    with torch.no_grad():
        probe = _as_tuple(torch_fn(*[_fresh(t) for t in inputs]))
    if grad_outputs is None:
        grad_outputs = [random_grad_like(o) for o in probe]
    ours_out, ours_grads = _run(ours_fn, inputs, grad_outputs, None, whole_backward)
    torch_out, torch_grads = _run(torch_fn, inputs, grad_outputs, None, whole_backward)
    ref_out, ref_grads = _run(ref_fn, inputs, grad_outputs, torch.float64, whole_backward)
    results = []
    for i, (o, t, r) in enumerate(zip(ours_out, torch_out, ref_out)):
        results.append(assert_gate(f"output{i}", o, t, r, **gate_kwargs))
    for name, o, t, r in zip(names, ours_grads, torch_grads, ref_grads):
        if r is None:
            continue
        if o is None:
            raise AssertionError(f"grad of {name}: missing, the reference has one")
        results.append(assert_gate(f"grad of {name}", o, t, r, **gate_kwargs))
    return results
