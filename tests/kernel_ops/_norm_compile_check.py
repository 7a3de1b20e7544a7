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

SM90_WARP_SIZE = 32
# Launch keywords that are compile options, not constexpr parameters.
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


def _signature(fn, args, kwargs):
    """Triton signature, constexprs and divisibility attributes of one recorded launch."""
    names = fn.arg_names
    sig, consts, attrs = {}, {}, {}
    types = {
        torch.bfloat16: "*bf16",
        torch.float16: "*fp16",
        torch.float32: "*fp32",
        torch.float64: "*fp64",
    }
    for i, (name, value) in enumerate(zip(names, args)):
        if isinstance(value, torch.Tensor):
            sig[name] = types[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # fresh allocations are 16-byte aligned
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    for name, value in kwargs.items():
        if name not in OPTIONS:
            sig[name] = "constexpr"
            consts[name] = value
    return {n: sig[n] for n in names}, consts, attrs


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

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

    seen = set()
    for fn, args, kwargs in launches:
        sig, consts, attrs = _signature(fn, args, kwargs)
        key = (
            fn.__name__,
            tuple(sorted(sig.items())),
            tuple(sorted(map(str, consts.items()))),
            kwargs.get("num_warps"),
        )
        if key in seen:
            continue
        seen.add(key)
        src = ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs)
        try:
            options = {k: v for k, v in kwargs.items() if k in OPTIONS}
            triton.compile(
                src,
                target=GPUTarget("cuda", 90, SM90_WARP_SIZE),
                options={"num_warps": 4, **options},
            )
        except Exception as exc:
            print(f"FAILED {fn.__name__} {consts}: {type(exc).__name__}: {exc}")
            return 1
        print(f"ok {fn.__name__} {options} {consts}")
    print(f"compiled {len(seen)} kernel configurations for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
