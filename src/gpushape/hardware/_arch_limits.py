"""What the catalog's chips share: units, per-SM limits by compute capability, tensor-core
alignment by architecture (conventions in `catalog.py`'s docstring)."""

from __future__ import annotations

from .spec import SMLimits

T = 1e12
GB = 1e9
MiB = 2**20
KiB = 2**10

# Per-SM limits by compute capability: CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability" (threads, warps, resident blocks, 32-bit registers, shared memory per SM
# and per block).
SM_LIMITS = {
    (7, 0): SMLimits(
        max_threads=2048,
        max_warps=64,
        max_blocks=32,
        registers=65536,
        shared_mem_bytes=96 * KiB,
        max_shared_mem_per_block_bytes=96 * KiB,
    ),
    (8, 0): SMLimits(
        max_threads=2048,
        max_warps=64,
        max_blocks=32,
        registers=65536,
        shared_mem_bytes=164 * KiB,
        max_shared_mem_per_block_bytes=163 * KiB,
    ),
    (8, 6): SMLimits(
        max_threads=1536,
        max_warps=48,
        max_blocks=16,
        registers=65536,
        shared_mem_bytes=100 * KiB,
        max_shared_mem_per_block_bytes=99 * KiB,
    ),
    (8, 9): SMLimits(
        max_threads=1536,
        max_warps=48,
        max_blocks=24,
        registers=65536,
        shared_mem_bytes=100 * KiB,
        max_shared_mem_per_block_bytes=99 * KiB,
    ),
    (9, 0): SMLimits(
        max_threads=2048,
        max_warps=64,
        max_blocks=32,
        registers=65536,
        shared_mem_bytes=228 * KiB,
        max_shared_mem_per_block_bytes=227 * KiB,
    ),
    (10, 0): SMLimits(
        max_threads=2048,
        max_warps=64,
        max_blocks=32,
        registers=65536,
        shared_mem_bytes=228 * KiB,
        max_shared_mem_per_block_bytes=227 * KiB,
    ),
}

# 16 bytes per dimension, in elements (see module docstring).
ALIGN_16B = {"fp64": 2, "tf32": 4, "fp32": 4, "fp16": 8, "bf16": 8, "fp8": 16, "int8": 16}
ALIGN_VOLTA = {"fp16": 8}  # V100 tensor cores take fp16 only
ALIGN_AMPERE = {k: v for k, v in ALIGN_16B.items() if k != "fp8"}
