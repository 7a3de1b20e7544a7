"""What the kernels' sm_90 compile checks share (`_norm_compile_check.py`,
`_max_pool_compile_check.py`): a recorded launch's Triton signature, and ptxas compiling each
distinct configuration for sm_90. The scripts run in a subprocess without TRITON_INTERPRET; each
drives its family's real launchers with a recorder in place of the kernels."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

SM90_WARP_SIZE = 32
POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.float64: "*fp64",
    torch.int8: "*i8",
}


def signature(kernel: Any, args: tuple, consts: Mapping[str, Any]) -> tuple[dict, dict]:
    """(signature, divisibility attributes) of one launch of `kernel` with runtime `args` and
    constexpr parameters `consts`."""
    sig, attrs = {}, {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if isinstance(value, torch.Tensor):
            sig[name] = POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # fresh allocations are 16-byte aligned
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    sig.update({name: "constexpr" for name in consts})
    return {n: sig[n] for n in kernel.arg_names}, attrs


def compile_for_sm90(launches: Iterable[tuple[Any, tuple, dict, dict]]) -> int:
    """Compile each distinct (kernel, args, constexprs, compile options) launch for sm_90;
    a line per configuration, and 1 at the first failure, else 0."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    seen = set()
    for kernel, args, consts, options in launches:
        sig, attrs = signature(kernel, args, consts)
        key = (
            kernel.__name__,
            tuple(sorted(sig.items())),
            tuple(sorted(map(str, consts.items()))),
            tuple(sorted(options.items())),
        )
        if key in seen:
            continue
        seen.add(key)
        src = ASTSource(kernel, signature=sig, constexprs=consts, attrs=attrs)
        try:
            triton.compile(
                src,
                target=GPUTarget("cuda", 90, SM90_WARP_SIZE),
                options={"num_warps": 4, **options},
            )
        except Exception as exc:
            print(f"FAILED {kernel.__name__} {consts}: {type(exc).__name__}: {exc}")
            return 1
        print(f"ok {kernel.__name__} {options} {consts}")
    print(f"compiled {len(seen)} kernel configurations for sm_90")
    return 0
