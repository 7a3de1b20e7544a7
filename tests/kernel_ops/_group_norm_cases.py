"""What the GroupNorm(+activation) tests share (CPU and GPU lanes): PyTorch's own composition
act(F.group_norm(...)) at the input's dtype, inputs in each layout, inputs kept off the
activations' kinks, and the numeric gate over y and every gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpushape.kernels import group_norm_act

from ._numeric import gate_forward_backward, outputs_and_grads

# activation -> PyTorch's own function (the composition every test compares against)
TORCH_ACT = {
    "none": lambda z: z,
    "relu": F.relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "hardswish": F.hardswish,
}
ACTIVATIONS = tuple(TORCH_ACT)

# layout -> (dims of x, memory format): 4-D NCHW contiguous, 4-D channels_last, 3-D (N, C, L)
# and 2-D (N, C) (both contiguous)
LAYOUTS = {
    "nchw": (4, torch.contiguous_format),
    "nchw-cl": (4, torch.channels_last),
    "ncl": (3, torch.contiguous_format),
    "nc": (2, torch.contiguous_format),
}

# where an activation's derivative jumps
KINKS = {"relu": (0.0,), "hardswish": (-3.0, 3.0)}
# Where the float64 pre-activation lies within KINK of a jump, float32 rounding may put it on the
# other side, and that one element's gradient then differs by O(|dy| * w * rstd) between any two
# correct implementations (PyTorch's float32 included). KINK is hundreds of times the float32
# rounding of a pre-activation of size ~5.
KINK = 1e-4


def case_shape(layout: str, n: int, c: int, h: int, w: int) -> tuple[int, ...]:
    """x's shape in a layout: (n, c, h, w) in 4-D, (n, c, h * w) in 3-D, (n, c) in 2-D."""
    dims = LAYOUTS[layout][0]
    return {4: (n, c, h, w), 3: (n, c, h * w), 2: (n, c)}[dims]


def torch_group_norm_act(x, num_groups, weight=None, bias=None, eps=1e-5, activation="none"):
    """PyTorch's own composition, at x's dtype: act(F.group_norm(x, ...))."""
    return TORCH_ACT[activation](F.group_norm(x, num_groups, weight, bias, eps))


def make_case(
    shape,
    dtype,
    layout: str = "nchw",
    *,
    affine: str = "both",
    device="cpu",
    offset: float = -0.3,
    spread: float = 0.7,
    param_dtype=None,
):
    """[x, weight, bias] requiring grad. x: offset + spread * N(0, 1) (mean away from zero) in
    `layout` ("nchw-cl": channels_last memory; the others contiguous); weight and bias random
    (a trained norm's are), in param_dtype (x's by default). affine: "both", "weight" (bias
    None) or "none" (both None)."""
    dims, fmt = LAYOUTS[layout]
    assert len(shape) == dims or (layout == "nchw" and len(shape) >= 2), (layout, shape)
    x = (offset + spread * torch.randn(shape, device=device)).to(dtype)
    if fmt == torch.channels_last:
        x = x.contiguous(memory_format=fmt)
    c = shape[1]
    pd = dtype if param_dtype is None else param_dtype
    weight = (1.0 + 0.5 * torch.randn(c, device=device)).to(pd) if affine != "none" else None
    bias = (0.3 * torch.randn(c, device=device)).to(pd) if affine == "both" else None
    return [t.requires_grad_() if t is not None else None for t in (x, weight, bias)]


def pre_activation64(x, num_groups, weight, bias, eps=1e-5):
    """The norm's output (before the activation) in float64."""
    return F.group_norm(
        x.detach().double(),
        num_groups,
        None if weight is None else weight.detach().double(),
        None if bias is None else bias.detach().double(),
        eps,
    )


@torch.no_grad()
def keep_off_kinks(x, num_groups, weight, bias, eps, activation, rounds=8):
    """Move the few elements of x whose pre-activation lies within KINK of a kink of the
    activation outward, in place (which moves the group statistics by ~KINK / group size:
    re-checked each round). No-op for the smooth activations. Elements of weight-0 channels
    stay: their pre-activation is the bias exactly, in every implementation."""
    kinks = KINKS.get(activation)
    if not kinks:
        return
    n, c = x.shape[0], x.shape[1]
    for _ in range(rounds):
        z = pre_activation64(x, num_groups, weight, bias, eps)
        at = torch.tensor(kinks, dtype=z.dtype, device=z.device)
        d = z - at[(z.unsqueeze(-1) - at).abs().argmin(-1)]  # from the nearest kink, signed
        # dz/dx = w * rstd (the statistics' share is O(1 / group size))
        xs = x.double().reshape(n, num_groups, -1)
        rstd = torch.rsqrt(xs.var(dim=2, correction=0) + eps)  # (n, G)
        gain = rstd.repeat_interleave(c // num_groups, dim=1)  # (n, C)
        if weight is not None:
            gain = gain * weight.double()
        gain = gain.reshape(n, c, *([1] * (x.dim() - 2))).expand_as(z)
        # a channel of weight 0 has z = bias exactly in any implementation: nothing to move
        near = (d.abs() < KINK) & (gain != 0)
        if not near.any():
            return
        x64 = x.double()
        step = torch.maximum(
            4 * KINK / gain.abs().clamp_min(1e-3),
            4 * torch.finfo(x.dtype).eps * x64.abs(),
        )
        direction = torch.where(d >= 0, 1.0, -1.0) * torch.where(gain >= 0, 1.0, -1.0)
        x.copy_(torch.where(near, x64 + direction * step, x64).to(x.dtype))
    raise AssertionError(f"could not move the pre-activations off the kinks at {kinks}")


def gate(x, weight, bias, num_groups, *, eps=1e-5, activation="none", kinks=True, **kw):
    """The numeric gate (TESTING.md) on y and the gradients of x, weight and bias (those that
    are tensors requiring grad), against act(F.group_norm(...)) at x's dtype and in float64.
    `kinks`: first move x off the activation's kinks (see KINK)."""
    if kinks:
        keep_off_kinks(x, num_groups, weight, bias, eps, activation)

    def ours(x, w, b):
        return group_norm_act(x, num_groups, w, b, eps, activation)

    def theirs(x, w, b):
        return torch_group_norm_act(x, num_groups, w, b, eps, activation)

    return gate_forward_backward(
        ours, theirs, (x, weight, bias), names=("x", "weight", "bias"), **kw
    )


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CL = torch.channels_last


def gn(num_groups, eps=1e-5, activation="none"):
    return lambda x, w, b: group_norm_act(x, num_groups, w, b, eps, activation)


def run_grads(fn, args, dy):
    """(y, dx, dw, db) of fn(*args) for the output gradient dy (None where no gradient)."""
    (y,), grads = outputs_and_grads(fn, args, [dy])
    return (y, *grads)


def fresh(*tensors):
    return [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]


def assert_equal(got, want, names=("y", "dx", "dw", "db")):
    for name, a, b in zip(names, got, want):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"
