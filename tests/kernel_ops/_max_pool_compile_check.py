"""Compile the max_pool2d kernels for sm_90 exactly as the launchers would launch them, without
a GPU (run in a subprocess without TRITON_INTERPRET, as _norm_compile_check.py does for the
norms): a recorder stands in for `Launch`, the real launchers run on small CPU tensors, and each
recorded launch is compiled with ptxas for sm_90. Prints one line per configuration; exits
non-zero on the first failure.
"""

from __future__ import annotations

import sys

import torch

SM90_WARP_SIZE = 32
POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.float64: "*fp64",
    torch.int8: "*i8",
}


def _signature(kernel, args, meta):
    """Triton signature, constexprs and divisibility attributes of one recorded launch."""
    sig, attrs = {}, {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if isinstance(value, torch.Tensor):
            sig[name] = POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # fresh allocations are 16-byte aligned
        else:
            sig[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    consts = {k: v for k, v in meta.items() if k != "num_warps"}
    sig.update({name: "constexpr" for name in consts})
    return {n: sig[n] for n in kernel.arg_names}, consts, attrs


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gpushape.kernels.pooling import _launch
    from gpushape.kernels.pooling._geometry import pool_geometry

    launches = []

    class Recorder:
        def __init__(self, kernel, grid, meta):
            self.kernel, self.meta = kernel, meta

        def __call__(self, is_aligned, *args):
            launches.append((self.kernel, args, self.meta))

    _launch.Launch = Recorder
    _launch.use_triton = lambda *tensors: True
    # every code path once (compiling takes about half a second a configuration): both
    # layouts at the stem's window and a non-square one in bf16, with and without taps;
    # float64 sums; the int64-index variant
    cl, cf = torch.channels_last, torch.contiguous_format
    cases = [
        (torch.bfloat16, cl, (3, 2, 1), True),
        (torch.bfloat16, cf, (3, 2, 1), True),
        (torch.bfloat16, cl, ((3, 2), (2, 1), (1, 0)), False),
        (torch.bfloat16, cf, ((3, 2), (2, 1), (1, 0)), False),
        (torch.float64, cl, (3, 2, 1), False),
    ]
    for dtype, fmt, pool, inference in cases:
        geom = pool_geometry(*pool)
        x = torch.randn(2, 64, 12, 12).to(dtype).contiguous(memory_format=fmt)
        y, taps = _launch.max_pool_forward(x, geom)
        if inference:
            _launch.max_pool_forward(x, geom, write_index=False)
        _launch.max_pool_backward(y, taps, (12, 12), geom, fmt == cl)
    _launch._INT32_LIMIT = 0
    _launch._PLANS.clear()
    y, taps = _launch.max_pool_forward(x, pool_geometry(3, 2, 1))
    _launch.max_pool_backward(y, taps, (12, 12), pool_geometry(3, 2, 1), True)

    seen = set()
    for kernel, args, meta in launches:
        sig, consts, attrs = _signature(kernel, args, meta)
        key = (kernel.__name__, tuple(sorted(sig.items())), tuple(sorted(consts.items())))
        if key in seen:
            continue
        seen.add(key)
        src = ASTSource(kernel, signature=sig, constexprs=consts, attrs=attrs)
        try:
            triton.compile(
                src,
                target=GPUTarget("cuda", 90, SM90_WARP_SIZE),
                options={"num_warps": meta["num_warps"]},
            )
        except Exception as exc:
            print(f"FAILED {kernel.__name__} {consts}: {type(exc).__name__}: {exc}")
            return 1
        print(f"ok {kernel.__name__} {consts}")
    print(f"compiled {len(seen)} kernel configurations for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
