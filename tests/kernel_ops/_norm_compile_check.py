"""Compile the norm kernels for sm_90 exactly as the launchers would launch them, without a GPU.

The interpreter (TRITON_INTERPRET=1) checks what the kernels compute, not that Triton can compile
them for a GPU. This script, run in a subprocess without the interpreter, stands in a recorder for
every kernel, drives the real launchers on small CPU tensors (the launch configuration depends on
N, the dtype and the flags, not on M beyond a cap), and compiles each recorded launch with ptxas
for sm_90. Prints one line per kernel configuration; exits non-zero on the first failure.
"""

from __future__ import annotations

import sys

import torch

# Launch keywords that are compile options, not constexpr parameters.
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


def main() -> int:
    import triton
    from _sm90_compile import compile_for_sm90

    from gpushape.kernels.norms import _common as _norm_common
    from gpushape.kernels.norms import _kernels as _norm_kernels
    from gpushape.kernels.norms._reference import ACT_NONE, GELU_ERF, GELU_TANH

    launches = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.fn, args, kwargs))

    for name in dir(_norm_kernels):
        obj = getattr(_norm_kernels, name)
        if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
            setattr(_norm_kernels, name, Recorder(obj))
    _norm_common.use_triton = lambda *tensors: True

    # Every code path at least once: bf16 (fast GELU) at an uneven N with several rows per
    # program and two-tile prefetch, and past the single-block limits (looped paths); fp32 (erf)
    # at an even N with 16 elements a thread (one-tile prefetch).
    flavours = (
        (GELU_ERF, False, True),
        (GELU_TANH, False, False),
        (ACT_NONE, False, True),
        (ACT_NONE, True, False),
    )  # (act, rms, residual)
    for dtype, n in ((torch.bfloat16, 768), (torch.bfloat16, 65537), (torch.float32, 8192)):
        x = torch.randn(64, n, dtype=dtype)
        w, b = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
        for act, rms, residual in flavours:
            r, bias = (x if residual and act == ACT_NONE else None), (None if rms else b)
            out = _norm_common.norm_forward(x, r, w, bias, 1e-5, act=act, rms=rms)
            _norm_common.norm_backward(x, r, x, w, bias, out.mean, out.rstd, act=act, rms=rms)

    return compile_for_sm90(
        (fn, args, {k: v for k, v in kwargs.items() if k not in OPTIONS},
         {k: v for k, v in kwargs.items() if k in OPTIONS})
        for fn, args, kwargs in launches
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
