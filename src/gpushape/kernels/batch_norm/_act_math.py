"""The smooth activations of batch_norm_act and their derivatives, elementwise in Triton.

ReLU has a path of its own (a mask bit an element, `_kernels.py`); these take the constexpr code
ACT below, and their backward recomputes the pre-activation h from x (`_act_bwd_kernels.py`).
In fp32 (fp64 for fp64 input), as PyTorch's kernels compute them, or with less cancellation:
  silu       h * s, s = sigmoid(h)                  d: s * (1 + h * (1 - s))
  gelu       h * Phi(h) (erf, nn.GELU's default)    d: Phi(h) + h * phi(h)       (norms/_math.py)
  gelu_tanh  h * S, S = (1 + tanh(u)) / 2 = sigmoid(2u), u = sqrt(2/pi) (h + 0.044715 h^3)
                                                    d: S + h * 2 S (1 - S) * du/dh
  hardswish  h * min(max(h + 3, 0), 6) / 6          d: 0 to -3, h / 3 + 1/2 below 3, 1 from 3
sigmoid(z) and 1 - sigmoid(z) both come from e = exp(-|z|) (`_sigmoid_pair`), so neither 1 - s
nor 1 - tanh^2 is a difference of nearly equal numbers: the tanh form's derivative computed as
1 - tanh(u)^2 from tanh = (1 - e) / (1 + e) errs ~1.5x PyTorch's (std::tanh); this one less.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..norms._math import _act as _gelu
from ..norms._math import _act_grad as _gelu_grad
from ..norms._math import _tanh_gelu_inner

# activation name -> ACT (0: no activation here: "none", or ReLU's own path)
ACT_CODES = {"silu": 1, "gelu": 2, "gelu_tanh": 3, "hardswish": 4}


@triton.jit
def _sigmoid_pair(z):
    """(sigmoid(z), 1 - sigmoid(z)), each without cancellation; NaN stays NaN."""
    e = tl.exp(-tl.abs(z))  # in (0, 1]: never overflows
    p = 1.0 / (1.0 + e)
    q = e * p
    pos = z >= 0.0
    return tl.where(pos, p, q), tl.where(pos, q, p)


@triton.jit
def _act_fwd(h, ACT: tl.constexpr):
    """act(h) for ACT in ACT_CODES' values."""
    y = h
    if ACT == 1:
        s, _ = _sigmoid_pair(h)
        y = h * s
    if ACT == 2:
        y = _gelu(h, 1, False)  # the norms' code 1: erf GELU, exact (not FAST)
    if ACT == 3:
        s, _ = _sigmoid_pair(2.0 * _tanh_gelu_inner(h))
        y = h * s
    if ACT == 4:
        y = h * tl.minimum(tl.maximum(h + 3.0, 0.0), 6.0) / 6.0
    return y


@triton.jit
def _act_grad(h, ACT: tl.constexpr):
    """d act(h) / dh. At hardswish's kinks torch's values (0 at -3, 1 at 3; 1 at NaN, as torch's
    backward, which then passes dy on)."""
    d = tl.full(h.shape, 1.0, h.dtype)
    if ACT == 1:
        s, c = _sigmoid_pair(h)
        d = s * (1.0 + h * c)
    if ACT == 2:
        d = _gelu_grad(h, 1, False)
    if ACT == 3:
        s, c = _sigmoid_pair(2.0 * _tanh_gelu_inner(h))
        d_inner = (1.0 + h * h * 0.134145) * 0.7978845608028654  # 0.134145 = 3 * 0.044715
        d = s + h * (2.0 * s * c) * d_inner
    if ACT == 4:
        d = tl.where(h <= -3.0, 0.0, tl.where(h < 3.0, h / 3.0 + 0.5, 1.0))
    return d
