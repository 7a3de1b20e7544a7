"""Elementwise math of the row-norm kernels (`_kernels.py`): GELU (exact, tanh, and a fast
normal CDF for bfloat16) and its derivative, the affine step, and the per-element gradients the
backward needs, with the one product that must be rounded exactly once.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

# The interpreter has no libdevice: there products are plain numpy products (never contracted).
_ROUNDED_MUL = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _tanh(z):
    # From exp(-2|z|) in (0, 1]: never overflows, and NaN stays NaN. (tl.math.tanh is not in
    # every Triton version this package supports.)
    e = tl.exp(-2.0 * tl.abs(z))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(z >= 0.0, t, -t)


# GELU constants are literals: a @triton.jit function may read only constexpr globals, and
# constexpr-times-tensor misbehaves in some interpreter versions.
#   0.7071067811865476 = 1/sqrt(2), 0.3989422804014327 = 1/sqrt(2 pi),
#   0.7978845608028654 = sqrt(2/pi), 0.044715 = the tanh approximation's cubic coefficient.
@triton.jit
def _tanh_gelu_inner(h):
    return (h + h * h * h * 0.044715) * 0.7978845608028654


@triton.jit
def _normal_cdf_fast(h):
    """Phi(h) ~= sigmoid(h * (1.59760287 + 0.0705641 h^2)): a logistic fit of the normal CDF,
    max abs error 1.4e-4 over the real line (1/28 of a bfloat16 unit in [0.5, 1)). The constants
    are the fit's times log2(e), for exp2; 1/d is rsqrt(d)^2 (d >= 1, so no range fix-up as in a
    division). About 8 instructions where erf takes ~34 (sm_90 SASS)."""
    r = tl.rsqrt(1.0 + tl.exp2(h * (-2.3048537378589753 - 0.1018024771347929 * h * h)))
    return r * r


@triton.jit
def _act(h, ACT: tl.constexpr, FAST: tl.constexpr):
    y = h
    if ACT == 1:
        if FAST:
            y = h * _normal_cdf_fast(h)
        else:
            y = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    if ACT == 2:
        y = 0.5 * h * (1.0 + _tanh(_tanh_gelu_inner(h)))
    return y


@triton.jit
def _act_grad(h, ACT: tl.constexpr, FAST: tl.constexpr):
    """d act(h) / dh for ACT in {1, 2} (callers skip it for the identity)."""
    if ACT == 1:
        # Phi(h) + h * phi(h); phi(h) = exp(-h^2/2) / sqrt(2 pi), with exp2 and log2(e) / 2.
        pdf = tl.exp2(h * h * -0.7213475204444817) * 0.3989422804014327
        if FAST:
            d = _normal_cdf_fast(h) + h * pdf
        else:
            d = 0.5 * (1.0 + tl.math.erf(h * 0.7071067811865476)) + h * pdf
    else:
        t = _tanh(_tanh_gelu_inner(h))
        d_inner = (1.0 + h * h * 0.134145) * 0.7978845608028654  # 0.134145 = 3 * 0.044715
        d = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * d_inner
    return d


@triton.jit
def _affine(xhat, w, b, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    h = xhat
    if HAS_W:
        h = h * w
    if HAS_B:
        h = h + b
    return h


@triton.jit
def _affine_act(
    xhat, w, b, ACT: tl.constexpr, FAST: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr
):
    return _act(_affine(xhat, w, b, HAS_W, HAS_B), ACT, FAST)


@triton.jit
def _rounded_mul(a, b):
    """a * b rounded once, never contracted into a later add (libdevice's mul_rn)."""
    if _ROUNDED_MUL:
        return libdevice.mul_rn(a, b)
    else:
        return a * b


@triton.jit
def _grads_at(
    xhat, dy, w, b, ACT: tl.constexpr, FAST: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr
):
    """Recompute the activation input from xhat and return (dh, g): dh = dL/dh (feeds dweight,
    dbias), g = dL/dxhat = dh * w (feeds dx).

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) subtracts g's row mean from g itself, so
    g must be the same rounded value in both places: were its product contracted into an FMA
    in dx but rounded inside the sum, they would differ by a rounding of g that rstd (up to
    1/sqrt(eps) ~ 316) amplifies (at N = 1, dx ~ 1e-5 where it is exactly 0). Hence the products
    that make g are rounded explicitly."""
    dh = dy
    if ACT != 0:
        dh = _rounded_mul(dy, _act_grad(_affine(xhat, w, b, HAS_W, HAS_B), ACT, FAST))
    g = dh
    if HAS_W:
        g = _rounded_mul(dh, w)
    return dh, g
