"""Check bodies shared by the row-norm ops (layer_norm_gelu, add_layer_norm, rms_norm).

Each op is described by a `NormCase`; _norm_suite.NormSuite (the shared matrix) and the op's own
test file call these checks with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ._numeric import assert_gate, gate_forward_backward, outputs_and_grads, random_grad_like


@dataclass(frozen=True)
class NormCase:
    """ours(*inputs) and PyTorch's composition torch_fn(*inputs) over the same inputs.

    The inputs are: the row tensors first (`row_inputs` of them: x, or x and residual), then
    the (N,) parameters named in `param_names` (weight, or weight and bias).
    """

    name: str
    ours: Callable[..., object]
    torch_fn: Callable[..., object]
    row_inputs: int
    param_names: tuple[str, ...]
    device: str = "cpu"

    @property
    def names(self) -> list[str]:
        rows = ["x", "residual"][: self.row_inputs]
        return [*rows, *self.param_names]

    def inputs(
        self,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        device: str | None = None,
        affine: bool = True,
        param_dtype: torch.dtype | None = None,
        requires_grad: bool = True,
        offset: float = -2.3,
    ) -> list[torch.Tensor | None]:
        """Fresh random inputs; rows have their mean far from zero (offset + 0.5 * randn)."""
        device = device or self.device
        work = torch.float64 if dtype == torch.float64 else torch.float32
        n = shape[-1]
        out: list[torch.Tensor | None] = [
            (offset + 0.5 * torch.randn(shape, device=device, dtype=work)).to(dtype)
            for _ in range(self.row_inputs)
        ]
        out += [
            torch.randn(n, device=device, dtype=work).to(param_dtype or dtype) if affine else None
            for _ in self.param_names
        ]
        return [None if t is None else t.requires_grad_(requires_grad) for t in out]


def on_device(case: NormCase, device: str) -> NormCase:
    return dataclasses.replace(case, device=device)


def _as_list(out: object) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def gate(case: NormCase, shape: Sequence[int], dtype: torch.dtype, **input_kwargs) -> None:
    """The numeric gate on the forward output(s) and every gradient, fresh random inputs."""
    inputs = case.inputs(shape, dtype, **input_kwargs)
    gate_forward_backward(case.ours, case.torch_fn, inputs, names=case.names)


def assert_same_as_contiguous(
    case: NormCase,
    make_view: Callable[[torch.Tensor], torch.Tensor],
    base_shape: Sequence[int],
    dtype: torch.dtype,
    grad_view: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """The op on a strided view equals the op on a contiguous copy of it, bitwise, forward and
    backward. grad_view, when given, turns each grad_output into a strided (e.g. expanded) one."""
    rows = [
        make_view(t) for t in case.inputs(base_shape, dtype, requires_grad=False)[: case.row_inputs]
    ]
    params = case.inputs((1, rows[0].shape[-1]), dtype, requires_grad=False)[case.row_inputs :]
    strided_rows = not rows[0].is_contiguous() or rows[0].storage_offset() > 0
    assert strided_rows or grad_view is not None, "nothing strided to test"
    strided = [t.requires_grad_() for t in rows] + [p.clone().requires_grad_() for p in params]
    dense = [t.detach().contiguous().requires_grad_() for t in rows] + [
        p.clone().requires_grad_() for p in params
    ]
    grads_out = [random_grad_like(o) for o in _as_list(case.ours(*dense))]
    strided_grads_out = [grad_view(g) if grad_view else g for g in grads_out]
    out_s, grad_s = outputs_and_grads(case.ours, strided, strided_grads_out)
    out_d, grad_d = outputs_and_grads(case.ours, dense, [g.contiguous() for g in strided_grads_out])
    for a, b in zip(out_s, out_d):
        assert torch.equal(a, b), "strided input gave a different forward result"
    for name, a, b in zip(case.names, grad_s, grad_d):
        assert torch.equal(a, b), f"strided input gave a different gradient of {name}"


def assert_nan_propagates(case: NormCase, dtype: torch.dtype, n: int = 33) -> None:
    """A NaN in one row makes that row's outputs NaN (as in PyTorch) and leaves the others
    finite; the gate then checks every value and NaN position against PyTorch."""
    inputs = case.inputs((4, n), dtype, requires_grad=False)
    x = inputs[0].clone()
    x[1, n // 2] = float("nan")
    inputs[0] = x
    inputs = [None if t is None else t.requires_grad_() for t in inputs]
    y = _as_list(case.ours(*inputs))[0]
    assert torch.isnan(y[1]).all(), "a NaN input did not make its row NaN"
    assert torch.isfinite(y[[0, 2, 3]]).all(), "a NaN leaked into other rows"
    gate_forward_backward(case.ours, case.torch_fn, inputs, names=case.names)


def constant_rows(case: NormCase, dtype: torch.dtype, n: int = 65) -> None:
    """Rows of one repeated value (variance 0): finite output, within the gate of PyTorch."""
    inputs = case.inputs((5, n), dtype, requires_grad=False)
    values = torch.tensor([-3.0, -0.5, 0.0, 1.25, 7.0], dtype=torch.float64, device=case.device)
    inputs[0] = values[:, None].expand(5, n).to(dtype).contiguous()
    inputs = [None if t is None else t.requires_grad_() for t in inputs]
    gate_forward_backward(case.ours, case.torch_fn, inputs, names=case.names)


def near_float16_max(case: NormCase, n: int = 65) -> None:
    """float16 rows of values near 65504: squares overflow float16, so statistics must be taken
    in float32 (as PyTorch does); the gate then holds as usual."""
    inputs = case.inputs((5, n), torch.float16, requires_grad=False)
    for i in range(case.row_inputs):
        big = 6.0e4 - 2.0e3 * torch.rand(5, n, device=case.device)
        inputs[i] = (big / case.row_inputs).to(torch.float16)  # a sum of rows stays finite
    inputs = [None if t is None else t.requires_grad_() for t in inputs]
    gate_forward_backward(case.ours, case.torch_fn, inputs, names=case.names)


def gradcheck_float64(case: NormCase, shape: Sequence[int] = (3, 7)) -> None:
    inputs = case.inputs(shape, torch.float64)
    assert torch.autograd.gradcheck(case.ours, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)


def _assert_all_equal(case: NormCase, what: str, outs_a, grads_a, outs_b, grads_b) -> None:
    for i, (a, b) in enumerate(zip(outs_a, outs_b)):
        assert torch.equal(a, b), f"{case.name}: {what}: output {i} differs"
    for name, a, b in zip(case.names, grads_a, grads_b):
        assert (a is None) == (b is None), f"{case.name}: {what}: grad of {name} missing"
        assert a is None or torch.equal(a, b), f"{case.name}: {what}: grad of {name} differs"


def compiled_equals_eager(
    case: NormCase, shape: Sequence[int], dtype: torch.dtype, device: str | None = None
) -> None:
    """torch.compile(fullgraph=True) over the op gives the eager op's outputs and gradients."""
    torch._dynamo.reset()
    compiled = torch.compile(case.ours, fullgraph=True)
    inputs = case.inputs(shape, dtype, device=device)
    grads_out = [random_grad_like(o) for o in _as_list(case.ours(*inputs))]
    eager = outputs_and_grads(case.ours, inputs, grads_out)
    comp = outputs_and_grads(compiled, inputs, grads_out)
    _assert_all_equal(case, "torch.compile", *comp, *eager)


# ---- GPU-only checks ------------------------------------------------------------------------
def cuda_graph_matches_eager(case: NormCase, shape: Sequence[int], dtype: torch.dtype) -> None:
    """Capture forward + backward in a CUDA graph, refill the inputs, replay: equals eager."""
    case = on_device(case, "cuda")
    static = case.inputs(shape, dtype)
    grads_out = [random_grad_like(o) for o in _as_list(case.ours(*static))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile kernels, fill caches, outside the capture
        for _ in range(2):
            outputs_and_grads(case.ours, static, grads_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = outputs_and_grads(case.ours, static, grads_out)
    fresh = case.inputs(shape, dtype)
    with torch.no_grad():
        for s, f in zip(static, fresh):
            if s is not None:
                s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    eager = outputs_and_grads(case.ours, fresh, grads_out)
    _assert_all_equal(case, "CUDA graph replay", *captured, *eager)


def repeated_backward_is_bitwise_equal(
    case: NormCase, shape: Sequence[int], dtype: torch.dtype, repeats: int = 50
) -> None:
    case = on_device(case, "cuda")
    inputs = case.inputs(shape, dtype)
    grads_out = [random_grad_like(o) for o in _as_list(case.ours(*inputs))]
    first = outputs_and_grads(case.ours, inputs, grads_out)
    for _ in range(repeats - 1):
        _assert_all_equal(
            case, "repeated backward", *outputs_and_grads(case.ours, inputs, grads_out), *first
        )


def rows_past_2_31_elements(case: NormCase, n: int) -> None:
    """Rows beyond element 2**31 are indexed correctly: the last rows' outputs and input
    gradients pass the gate against PyTorch run on those rows alone."""
    case = on_device(case, "cuda")
    m = 2**31 // n + 2
    inputs = case.inputs((m, n), torch.bfloat16)
    outs = _as_list(case.ours(*inputs))
    grads_out = [random_grad_like(o) for o in outs]
    rows = list(inputs[: case.row_inputs])
    big_grads = torch.autograd.grad(outs, rows, grads_out)
    tail = slice(m - 3, m)
    small = [t[tail].detach().clone().requires_grad_() for t in rows] + list(
        inputs[case.row_inputs :]
    )
    small_grads_out = [g[tail] for g in grads_out]
    torch_outs, torch_grads = outputs_and_grads(case.torch_fn, small, small_grads_out)
    wide = [None if t is None else t.detach().double().requires_grad_() for t in small]
    ref_outs, ref_grads = outputs_and_grads(case.torch_fn, wide, small_grads_out)
    for i, (o, t, r) in enumerate(zip(outs, torch_outs, ref_outs)):
        assert_gate(f"output {i} past 2**31", o[tail], t, r)
    for name, g, t, r in zip(case.names, big_grads, torch_grads, ref_grads):
        assert_gate(f"grad of {name} past 2**31", g[tail], t, r)
