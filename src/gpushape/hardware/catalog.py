"""The chip catalog: datasheet numbers, each with its source.

Conventions: rates are dense (no 2:4 sparsity) peaks in FLOP/s (OP/s for int8); where a
datasheet prints only the sparse figure (marked *), the dense one is half of it. Bandwidths are
bytes/s; NVLink and PCIe are totals over both directions, as NVIDIA quotes them. Sizes are bytes
(GB = 1e9, MB of L2 = 2**20, as the whitepapers count cache). Tensor-core alignment is the
cuBLAS/cuDNN rule "dimensions a multiple of 16 bytes" (NVIDIA Deep Learning Performance Guide,
"Matrix Multiplication Background", Tensor Core Requirements): 8 fp16/bf16, 4 tf32, 16 fp8/int8,
2 fp64 elements. `gpushape probe` measures the real cliff and overrides it.

The chips live by generation in `_chips_volta_to_ada.py` and `_chips_hopper_blackwell.py`; what
they share (units, per-SM limits, alignment tables) in `_arch_limits.py`.
"""

from __future__ import annotations

from . import _chips_hopper_blackwell, _chips_volta_to_ada
from .spec import GPUSpec

# In the order `gpushape gpus` lists them.
CATALOG: tuple[GPUSpec, ...] = (*_chips_volta_to_ada.CHIPS, *_chips_hopper_blackwell.CHIPS)
