"""Shared inputs and checks of the batch_norm_act tests (CPU interpreter lane and GPU lane)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpushape.kernels.batch_norm.batch_norm_act import (
    BatchNormAct2d,
    batch_norm_act,
    batch_norm_act_apply,
    batch_norm_act_backward,
    batch_norm_stats,
)

from ._numeric import gate_forward_backward

# activation -> PyTorch's own function (the composition every test compares against)
TORCH_ACT = {
    "relu": F.relu,
    "none": lambda y: y,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "hardswish": F.hardswish,
}
SMOOTH = ("silu", "gelu", "gelu_tanh", "hardswish")  # the backward recomputes the pre-activation
# where an activation's derivative jumps (see KINK)
KINKS = {"relu": (0.0,), "hardswish": (-3.0, 3.0)}

CL = torch.channels_last
CF = torch.contiguous_format
CUDA = torch.device("cuda")
VARIANTS = [  # training, activation, residual, affine
    (True, "none", True, True),
    (True, "relu", False, True),
    (True, "none", False, False),
    (False, "relu", True, True),
    (False, "none", False, True),
    (False, "relu", False, False),
]


def _torch_composition(training: bool, activation: str, running=None):
    """PyTorch's own BatchNorm2d + add + activation, as a function of (x, w, b[, r])."""

    def fn(x, w, b, r=None):
        stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        rm, rv = (t.to(x.device, stat_dtype) for t in running) if running else (None, None)
        y = F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5) + (0 if r is None else r)
        return TORCH_ACT[activation](y)

    return fn


def _ours(training: bool, activation: str, running=None):
    def fn(x, w, b, r=None):
        rm, rv = (t.clone().to(x.device) for t in running) if running else (None, None)
        return batch_norm_act(x, w, b, rm, rv, training, 0.1, 1e-5, activation, r)

    return fn


def _inputs(shape, dtype, fmt, device="cpu", offset=-2.3, residual=True, affine=True):
    """x with a mean far from zero, fp32 affine parameters (as under autocast), a residual."""
    c = shape[1]
    x = (offset + 0.5 * torch.randn(shape)).to(dtype).to(device, memory_format=fmt)
    w = (1 + 0.3 * torch.randn(c)).to(device) if affine else None
    b = (0.2 * torch.randn(c)).to(device) if affine else None
    r = torch.randn(shape).to(dtype).to(device, memory_format=fmt) if residual else None
    return [t.requires_grad_() if t is not None else None for t in (x, w, b, r)]


# ReLU's derivative jumps at 0 (Hardswish's at -3 and 3): where the float64 pre-activation lies
# within KINK of a jump, float32 rounding may put it on the other side, and that one element's
# gradient then differs by O(|dy| * w * rstd) between any two correct implementations (torch's
# fp32 included). KINK is hundreds of times the fp32 rounding of a pre-activation of size ~5.
KINK = 1e-4


def _pre_activation64(x, w, b, r, training, running):
    """BN(x) * w + b + r in float64 (running stats cloned: training blends them in place)."""
    rm, rv = (t.to(x.device, torch.float64).clone() for t in running)
    z = F.batch_norm(
        x.double(),
        rm,
        rv,
        None if w is None else w.double(),
        None if b is None else b.double(),
        training,
        0.1,
        1e-5,
    )
    return z if r is None else z + r.double()


def _keep_off_relu_kink(x, w, b, r, training, running, rounds=8):
    _keep_off_kinks(x, w, b, r, training, running, KINKS["relu"], rounds)


@torch.no_grad()
def _keep_off_kinks(x, w, b, r, training, running, kinks, rounds=8):
    """Move the few elements whose pre-activation lies within KINK of a kink outward, in
    place: through the residual when there is one (the statistics do not depend on it), else
    through x (which moves the statistics by ~KINK / (N*H*W): re-checked each round)."""
    for _ in range(rounds):
        z = _pre_activation64(x, w, b, r, training, running)
        at = torch.tensor(kinks, dtype=z.dtype, device=z.device)
        d = z - at[(z.unsqueeze(-1) - at).abs().argmin(-1)]  # from the nearest kink, signed
        near = d.abs() < KINK
        if not near.any():
            return
        target = x if r is None else r
        t64 = target.double()
        step = torch.clamp(4 * torch.finfo(target.dtype).eps * t64.abs(), min=4 * KINK)
        direction = torch.where(d >= 0, 1.0, -1.0)
        if r is None:  # dz/dx = w * rstd (the statistics' share is O(1 / (N*H*W)))
            if training:
                var = x.double().var(dim=(0, 2, 3), correction=0)
            else:
                var = running[1].to(x.device, torch.float64)
            gain = torch.rsqrt(var + 1e-5) * (1.0 if w is None else w.double())
            gain = gain.view(1, -1, 1, 1).expand_as(z)
            direction = direction * torch.sign(gain)
            step = step / gain.abs().clamp_min(1e-3)
        target.copy_(torch.where(near, t64 + direction * step, t64).to(target.dtype))
    raise AssertionError(f"could not move the pre-activations off the kinks at {kinks}")


def _gate(
    shape,
    dtype,
    fmt,
    *,
    training=True,
    activation="relu",
    residual=True,
    affine=True,
    device="cpu",
    offset=-2.3,
    **gate_kwargs,
):
    x, w, b, r = _inputs(shape, dtype, fmt, device, offset, residual, affine)
    running = (0.1 * torch.randn(shape[1]), 0.5 + torch.rand(shape[1]))
    if activation in KINKS:
        _keep_off_kinks(x, w, b, r, training, running, KINKS[activation])
    args = (x, w, b) if r is None else (x, w, b, r)
    return gate_forward_backward(
        _ours(training, activation, running),
        _torch_composition(training, activation, running),
        args,
        names=("x", "weight", "bias", "residual")[: len(args)],
        **gate_kwargs,
    )


def _run_fwd_bwd(x, r, dy, w, b, activation="relu"):
    x, r = x.detach().requires_grad_(), r.detach().requires_grad_()
    y = batch_norm_act(x, w, b, None, None, True, activation=activation, residual=r)
    y.backward(dy)
    return y.detach(), x.grad, r.grad


def _module_step(module, x, r, dy):
    x, r = x.detach().requires_grad_(), r.detach().requires_grad_()
    y = module(x, r)
    y.backward(dy)
    return y.detach(), x.grad, r.grad, module.weight.grad


def _check_compiled_module(device, activation="relu"):
    """torch.compile(fullgraph=True) over the module matches eager. AOTAutograd's on-disk cache
    is off: its key covers the forward graph, not a custom op's registered backward, so an
    entry compiled before the backward op's schema changed would be replayed."""
    torch._dynamo.reset()
    eager = BatchNormAct2d(16, activation=activation).to(device)
    compiled = BatchNormAct2d(16, activation=activation).to(device)
    fn = torch.compile(compiled, fullgraph=True)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        _compare_steps(eager, compiled, fn, device)


def _compare_steps(eager, compiled, fn, device):
    for _ in range(2):
        x, _, _, r = (t.detach() for t in _inputs((4, 16, 6, 5), torch.float32, CL, device))
        dy = torch.randn_like(x)
        for a, c in zip(_module_step(eager, x, r, dy), _module_step(fn, x, r, dy)):
            torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5)
        eager.weight.grad = compiled.weight.grad = None
    for name, t in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], t)


def _opcheck_all(device, activation="relu"):
    """Schema, fake implementation, autograd registration and AOT dispatch of the three ops
    (eager calls bypass them; torch.compile relies on them)."""
    x, w, b, r = _inputs((2, 5, 3, 4), torch.float32, CL, device)
    mean, rstd = batch_norm_stats(x.detach(), None, None, 0.1, 1e-5)
    running = (torch.zeros(5, device=device), torch.ones(5, device=device))
    apply_args = (x, mean, rstd, w, b, r, 1e-5, True, activation)
    bits = batch_norm_act_apply(*apply_args)[1]
    # bias and residual: what the smooth activations' backward recomputes from (else None)
    saved = (b.detach(), r.detach()) if activation in SMOOTH else (None, None)
    bwd_args = (torch.randn_like(x), x.detach(), w.detach(), *saved, mean, rstd, bits)
    bwd_args += (1e-5, True, activation, True)
    for op, args in (
        (batch_norm_stats, (x.detach(), *running, 0.1, 1e-5)),
        (batch_norm_act_apply, apply_args),
        (batch_norm_act_backward, bwd_args),
    ):
        torch.library.opcheck(op, args)
