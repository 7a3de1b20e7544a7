"""Shared inputs and checks of the max_pool2d tests (CPU interpreter lane and GPU lane).

The kernels select values and add gradients, so the checks are exact where the arithmetic is:
the forward (values, NaN places, taps) equals PyTorch's bit for bit in every dtype, and the
gradient equals PyTorch's float32 gradient (same values summed in the same ascending order)
rounded once to the input's dtype; PyTorch's CPU kernel adds 16-bit gradients in 16 bits, so
for fp16/bf16 the float32 run is the reference, and the numeric gate of TESTING.md
(`_numeric.py`, against float64) runs beside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpushape.kernels import max_pool2d
from gpushape.kernels.pooling._geometry import Pool2d, channels_last, pool_geometry
from gpushape.kernels.pooling._launch import max_pool_forward
from gpushape.kernels.pooling._reference import reference_forward

from ._numeric import gate_forward_backward

CL = torch.channels_last
CF = torch.contiguous_format
FORMATS = {"channels_last": CL, "nchw": CF}
# (kernel, stride, padding): ResNet's stem, the common 2x2, overlapping, wide, identity,
# and non-square ones
POOLS = [
    (3, 2, 1),
    (2, 2, 0),
    (3, 1, 1),
    (5, 3, 2),
    (1, 1, 0),
    ((3, 2), (2, 1), (1, 0)),
    ((2, 5), (1, 3), (0, 2)),
]
# relative size of one unit in the last place, by dtype (the interpreter rounds float32 to
# bfloat16 by truncation: a gradient may sit one unit from PyTorch's round-to-nearest)
ULP = {torch.float64: 0.0, torch.float32: 0.0, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def pool_id(pool) -> str:
    k, s, p = pool
    return f"k{k}-s{s}-p{p}".replace(" ", "")


def make_input(
    shape, dtype=torch.float32, fmt=CF, *, ties: bool = False, device="cpu"
) -> torch.Tensor:
    """Normal values, or with ties=True small integers (-2..2), so that windows hold several
    equal maxima; laid out in `fmt`, requiring grad."""
    if ties:
        x = torch.randint(-2, 3, shape, device=device).to(dtype)
    else:
        x = torch.randn(shape, device=device).to(dtype)
    return x.contiguous(memory_format=fmt).requires_grad_()


def run(fn, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, dx) of fn on a fresh leaf copy of x (x's strides kept)."""
    leaf = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    y = fn(leaf)
    y.backward(dy)
    return y.detach(), leaf.grad


def assert_same_layout(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    for fmt in (CL, CF):
        assert ours.is_contiguous(memory_format=fmt) == theirs.is_contiguous(memory_format=fmt), (
            f"{what}: strides {ours.stride()} vs PyTorch's {theirs.stride()}"
        )


def check_against_torch(
    x: torch.Tensor, pool, *, gate: bool = True, exact: bool | None = None
) -> None:
    """Forward equal to F.max_pool2d (values, NaN, layout), the taps equal to those of
    PyTorch's indices, dx equal to PyTorch's float32 dx rounded once (one unit of slack for
    16-bit dtypes in the interpreter, none on a GPU: `exact` defaults to x being on CUDA), dx
    in x's layout; with gate, TESTING.md's numeric gate too."""
    exact = x.is_cuda if exact is None else exact
    k, s, p = pool

    def ours(t):
        return max_pool2d(t, k, s, p)

    def theirs(t):
        return F.max_pool2d(t, k, s, p)

    probe = theirs(x.detach())
    dy = torch.randn(probe.shape, device=x.device).to(x.dtype)
    y, dx = run(ours, x, dy)
    y_ref, dx_ref = run(theirs, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0, equal_nan=True)
    assert_same_layout(y, y_ref, "y")
    assert_same_layout(dx, dx_ref, "dx")
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    _, dx_wide = run(theirs, x.to(wide), dy.to(wide))
    expected = dx_wide.to(x.dtype)
    rtol = 0.0 if exact else ULP[x.dtype]
    torch.testing.assert_close(dx, expected, rtol=rtol, atol=0, equal_nan=True)
    if x.dim() == 4:
        check_taps(x.detach(), pool)
    if gate:
        gate_forward_backward(ours, theirs, (x,), names=("x",))


def check_taps(x: torch.Tensor, pool) -> None:
    """The kernel's int8 taps equal those of PyTorch's own indices (the reference's)."""
    geom = pool_geometry(*pool)
    cl = channels_last(x)
    y, taps = max_pool_forward(x, geom, cl)
    y_ref, taps_ref = reference_forward(x.contiguous(memory_format=CL if cl else CF), geom, cl)
    assert taps.dtype == torch.int8 and torch.equal(taps, taps_ref), (
        f"taps differ at {int((taps != taps_ref).sum())} of {taps.numel()} outputs"
    )
    assert taps.stride() == y.stride() == y_ref.stride()


def special_values(shape, dtype=torch.float32, fmt=CF) -> torch.Tensor:
    """Normal values with NaNs (some windows hold two), -inf, +inf, and one plane all -inf."""
    x = torch.randn(shape).to(dtype)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel())
    flat[picks[:6]] = float("nan")
    flat[picks[6:12]] = float("-inf")
    flat[picks[12:14]] = float("inf")
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = float("nan")  # two NaNs sharing windows: the last wins
    x[-1, -1] = float("-inf")  # every window -inf: the first in-bounds tap is the index
    return x.contiguous(memory_format=fmt).requires_grad_()


def geometry(pool) -> Pool2d:
    return pool_geometry(*pool)
