"""Compile the max_pool2d kernels for sm_90 exactly as the launchers would launch them, without
a GPU (run in a subprocess without TRITON_INTERPRET, as _norm_compile_check.py does for the
norms): a recorder stands in for `Launch`, the real launchers run on small CPU tensors, and each
recorded launch is compiled with ptxas for sm_90. Prints one line per configuration; exits
non-zero on the first failure.
"""

from __future__ import annotations

import sys

import torch


def main() -> int:
    from _sm90_compile import compile_for_sm90

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

    return compile_for_sm90(
        (kernel, args, {k: v for k, v in meta.items() if k != "num_warps"},
         {"num_warps": meta["num_warps"]})
        for kernel, args, meta in launches
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
