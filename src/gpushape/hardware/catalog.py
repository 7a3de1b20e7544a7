"""The chip catalog: datasheet numbers, each with its source.

Conventions: rates are dense (no 2:4 sparsity) peaks in FLOP/s (OP/s for int8); where a
datasheet prints only the sparse figure (marked *), the dense one is half of it. Bandwidths are
bytes/s; NVLink and PCIe are totals over both directions, as NVIDIA quotes them. Sizes are bytes
(GB = 1e9, MB of L2 = 2**20, as the whitepapers count cache). Tensor-core alignment is the
cuBLAS/cuDNN rule "dimensions a multiple of 16 bytes" (NVIDIA Deep Learning Performance Guide,
"Matrix Multiplication Background", Tensor Core Requirements): 8 fp16/bf16, 4 tf32, 16 fp8/int8,
2 fp64 elements. `gpushape probe` measures the real cliff and overrides it.
"""

from __future__ import annotations

from .spec import Achievable, GPUSpec, SMLimits

T = 1e12
GB = 1e9
MiB = 2**20
KiB = 2**10

# Per-SM limits by compute capability: CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability" (threads, warps, resident blocks, 32-bit registers, shared memory per SM
# and per block).
_SM_LIMITS = {
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
_ALIGN_16B = {"fp64": 2, "tf32": 4, "fp32": 4, "fp16": 8, "bf16": 8, "fp8": 16, "int8": 16}
_ALIGN_VOLTA = {"fp16": 8}  # V100 tensor cores take fp16 only
_ALIGN_AMPERE = {k: v for k, v in _ALIGN_16B.items() if k != "fp8"}

CATALOG: tuple[GPUSpec, ...] = (
    GPUSpec(
        name="v100-sxm2",
        full_name="NVIDIA Tesla V100 SXM2 32GB",
        aliases=("v100", "v100-sxm2-32gb", "v100-sxm2-16gb", "v100-32gb"),
        arch="volta",
        compute_capability=(7, 0),
        sm_count=80,
        boost_clock_hz=1530e6,
        # V100 datasheet (2020): 900 GB/s HBM2, 32 GB; Volta whitepaper: 6 MB L2.
        memory_bytes=32 * 10**9,
        memory_bandwidth_bytes_per_s=900 * GB,
        l2_bytes=6 * MiB,
        # V100 datasheet, SXM2: FP64 7.8, FP32 15.7, Tensor 125 TFLOPS; FP16 non-tensor 2x FP32.
        tensor_core_flops={"fp16": 125 * T},
        cuda_core_flops={"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 31.4 * T},
        tc_align_elems=_ALIGN_VOLTA,
        sm_limits=_SM_LIMITS[(7, 0)],
        # V100 datasheet: NVLink 300 GB/s; PCIe Gen3 x16 32 GB/s.
        nvlink_bandwidth_bytes_per_s=300 * GB,
        pcie_bandwidth_bytes_per_s=32 * GB,
        sources=(
            "NVIDIA V100 Tensor Core GPU datasheet",
            "NVIDIA Tesla V100 GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="a100-40gb",
        full_name="NVIDIA A100 SXM4 40GB",
        aliases=("a100-sxm4-40gb", "a100-40gb-sxm", "a100-sxm-40gb"),
        arch="ampere",
        compute_capability=(8, 0),
        sm_count=108,
        boost_clock_hz=1410e6,
        # A100 datasheet: 40 GB HBM2 at 1,555 GB/s; A100 whitepaper: 40 MB L2.
        memory_bytes=40 * 10**9,
        memory_bandwidth_bytes_per_s=1555 * GB,
        l2_bytes=40 * MiB,
        # A100 datasheet: FP64 9.7, FP64 TC 19.5, FP32 19.5, TF32 156, BF16/FP16 312, INT8 624.
        # A100 whitepaper table 1: FP16 non-tensor 78, BF16 non-tensor 39 TFLOPS.
        tensor_core_flops={
            "fp64": 19.5 * T,
            "tf32": 156 * T,
            "fp16": 312 * T,
            "bf16": 312 * T,
            "int8": 624 * T,
        },
        cuda_core_flops={"fp64": 9.7 * T, "fp32": 19.5 * T, "fp16": 78 * T, "bf16": 39 * T},
        tc_align_elems=_ALIGN_AMPERE,
        sm_limits=_SM_LIMITS[(8, 0)],
        # A100 datasheet: NVLink 600 GB/s; PCIe Gen4 64 GB/s.
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=(
            "NVIDIA A100 Tensor Core GPU datasheet",
            "NVIDIA A100 Tensor Core GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="a100-80gb",
        full_name="NVIDIA A100 SXM4 80GB",
        aliases=("a100", "a100-sxm4-80gb", "a100-80gb-sxm", "a100-sxm-80gb", "a100-sxm"),
        arch="ampere",
        compute_capability=(8, 0),
        sm_count=108,
        boost_clock_hz=1410e6,
        # A100 datasheet: 80 GB HBM2e at 2,039 GB/s; 40 MB L2 as the 40 GB part.
        memory_bytes=80 * 10**9,
        memory_bandwidth_bytes_per_s=2039 * GB,
        l2_bytes=40 * MiB,
        # A100 datasheet and whitepaper, as the 40 GB part.
        tensor_core_flops={
            "fp64": 19.5 * T,
            "tf32": 156 * T,
            "fp16": 312 * T,
            "bf16": 312 * T,
            "int8": 624 * T,
        },
        cuda_core_flops={"fp64": 9.7 * T, "fp32": 19.5 * T, "fp16": 78 * T, "bf16": 39 * T},
        tc_align_elems=_ALIGN_AMPERE,
        sm_limits=_SM_LIMITS[(8, 0)],
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=(
            "NVIDIA A100 Tensor Core GPU datasheet",
            "NVIDIA A100 Tensor Core GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="a10",
        full_name="NVIDIA A10 24GB",
        aliases=("a10-24gb",),
        arch="ampere",
        compute_capability=(8, 6),
        sm_count=72,
        boost_clock_hz=1695e6,
        # A10 datasheet: 24 GB GDDR6 at 600 GB/s; GA102 whitepaper: 6 MB L2.
        memory_bytes=24 * 10**9,
        memory_bandwidth_bytes_per_s=600 * GB,
        l2_bytes=6 * MiB,
        # A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16/FP16 125 (250*), INT8 250 (500*).
        # GA102 whitepaper: FP64 at 1/64 of FP32; FP16/BF16 non-tensor at the FP32 rate.
        tensor_core_flops={"tf32": 62.5 * T, "fp16": 125 * T, "bf16": 125 * T, "int8": 250 * T},
        cuda_core_flops={
            "fp64": 31.2 * T / 64,
            "fp32": 31.2 * T,
            "fp16": 31.2 * T,
            "bf16": 31.2 * T,
        },
        tc_align_elems=_ALIGN_AMPERE,
        sm_limits=_SM_LIMITS[(8, 6)],
        # A10 datasheet: PCIe Gen4 64 GB/s; no NVLink.
        nvlink_bandwidth_bytes_per_s=None,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=(
            "NVIDIA A10 Tensor Core GPU datasheet",
            "NVIDIA Ampere GA102 GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="l4",
        full_name="NVIDIA L4 24GB",
        aliases=("l4-24gb",),
        arch="ada",
        compute_capability=(8, 9),
        sm_count=58,
        boost_clock_hz=2040e6,
        # L4 datasheet: 24 GB GDDR6 at 300 GB/s; Ada whitepaper (AD104): 48 MB L2.
        memory_bytes=24 * 10**9,
        memory_bandwidth_bytes_per_s=300 * GB,
        l2_bytes=48 * MiB,
        # L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485*, INT8 485* TOPS.
        # Ada whitepaper: FP64 at 1/64 of FP32; FP16 non-tensor at the FP32 rate.
        tensor_core_flops={
            "tf32": 60 * T,
            "fp16": 121 * T,
            "bf16": 121 * T,
            "fp8": 242.5 * T,
            "int8": 242.5 * T,
        },
        cuda_core_flops={
            "fp64": 30.3 * T / 64,
            "fp32": 30.3 * T,
            "fp16": 30.3 * T,
            "bf16": 30.3 * T,
        },
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(8, 9)],
        nvlink_bandwidth_bytes_per_s=None,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=("NVIDIA L4 Tensor Core GPU datasheet", "NVIDIA Ada GPU architecture whitepaper"),
    ),
    GPUSpec(
        name="l40s",
        full_name="NVIDIA L40S 48GB",
        aliases=("l40s-48gb",),
        arch="ada",
        compute_capability=(8, 9),
        sm_count=142,
        boost_clock_hz=2520e6,
        # L40S datasheet: 48 GB GDDR6 at 864 GB/s; Ada whitepaper (AD102): 96 MB L2.
        memory_bytes=48 * 10**9,
        memory_bandwidth_bytes_per_s=864 * GB,
        l2_bytes=96 * MiB,
        # L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733 (1,466*),
        # INT8 733 (1,466*) TOPS. FP64 at 1/64 of FP32 (Ada whitepaper).
        tensor_core_flops={
            "tf32": 183 * T,
            "fp16": 362.05 * T,
            "bf16": 362.05 * T,
            "fp8": 733 * T,
            "int8": 733 * T,
        },
        cuda_core_flops={
            "fp64": 91.6 * T / 64,
            "fp32": 91.6 * T,
            "fp16": 91.6 * T,
            "bf16": 91.6 * T,
        },
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(8, 9)],
        nvlink_bandwidth_bytes_per_s=None,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=("NVIDIA L40S GPU datasheet", "NVIDIA Ada GPU architecture whitepaper"),
    ),
    GPUSpec(
        name="rtx-3090",
        full_name="NVIDIA GeForce RTX 3090 24GB",
        aliases=("3090", "rtx3090", "geforce-rtx-3090"),
        arch="ampere",
        compute_capability=(8, 6),
        sm_count=82,
        boost_clock_hz=1695e6,
        # GA102 whitepaper, appendix table: 24 GB GDDR6X at 936 GB/s, 6 MB L2.
        memory_bytes=24 * 10**9,
        memory_bandwidth_bytes_per_s=936 * GB,
        l2_bytes=6 * MiB,
        # GA102 whitepaper: FP32 35.6; tensor FP16/BF16 with FP32 accumulate 71 (142 with FP16
        # accumulate; training uses FP32 accumulate), TF32 35.6, INT8 284 TOPS.
        tensor_core_flops={"tf32": 35.6 * T, "fp16": 71 * T, "bf16": 71 * T, "int8": 284 * T},
        cuda_core_flops={
            "fp64": 35.6 * T / 64,
            "fp32": 35.6 * T,
            "fp16": 35.6 * T,
            "bf16": 35.6 * T,
        },
        tc_align_elems=_ALIGN_AMPERE,
        sm_limits=_SM_LIMITS[(8, 6)],
        # GA102 whitepaper: NVLink bridge 112.5 GB/s total; PCIe Gen4 64 GB/s.
        nvlink_bandwidth_bytes_per_s=112.5 * GB,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=("NVIDIA Ampere GA102 GPU architecture whitepaper",),
    ),
    GPUSpec(
        name="rtx-4090",
        full_name="NVIDIA GeForce RTX 4090 24GB",
        aliases=("4090", "rtx4090", "geforce-rtx-4090"),
        arch="ada",
        compute_capability=(8, 9),
        sm_count=128,
        boost_clock_hz=2520e6,
        # Ada whitepaper, appendix table: 24 GB GDDR6X at 1,008 GB/s, 72 MB L2.
        memory_bytes=24 * 10**9,
        memory_bandwidth_bytes_per_s=1008 * GB,
        l2_bytes=72 * MiB,
        # Ada whitepaper: FP32 82.6; FP16/BF16 tensor with FP32 accumulate 165.2, TF32 82.6,
        # FP8 with FP32 accumulate 330.3, INT8 660.6 TOPS.
        tensor_core_flops={
            "tf32": 82.6 * T,
            "fp16": 165.2 * T,
            "bf16": 165.2 * T,
            "fp8": 330.3 * T,
            "int8": 660.6 * T,
        },
        cuda_core_flops={
            "fp64": 82.6 * T / 64,
            "fp32": 82.6 * T,
            "fp16": 82.6 * T,
            "bf16": 82.6 * T,
        },
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(8, 9)],
        nvlink_bandwidth_bytes_per_s=None,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=("NVIDIA Ada GPU architecture whitepaper",),
    ),
    GPUSpec(
        name="h100-sxm",
        full_name="NVIDIA H100 SXM5 80GB",
        aliases=("h100", "h100-sxm5", "h100-sxm5-80gb", "h100-80gb-hbm3", "h100-sxm-80gb"),
        arch="hopper",
        compute_capability=(9, 0),
        sm_count=132,
        boost_clock_hz=1980e6,
        # H100 datasheet: 80 GB HBM3 at 3.35 TB/s; H100 whitepaper: 50 MB L2.
        memory_bytes=80 * 10**9,
        memory_bandwidth_bytes_per_s=3350 * GB,
        l2_bytes=50 * MiB,
        # H100 whitepaper table 2 (SXM5): FP64 33.5, FP64 TC 66.9, FP32 66.9, FP16/BF16
        # non-tensor 133.8, TF32 494.7, FP16/BF16 989.4, FP8 1,978.9, INT8 1,978.9 TOPS.
        tensor_core_flops={
            "fp64": 66.9 * T,
            "tf32": 494.7 * T,
            "fp16": 989.4 * T,
            "bf16": 989.4 * T,
            "fp8": 1978.9 * T,
            "int8": 1978.9 * T,
        },
        cuda_core_flops={"fp64": 33.5 * T, "fp32": 66.9 * T, "fp16": 133.8 * T, "bf16": 133.8 * T},
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(9, 0)],
        # H100 datasheet: NVLink 900 GB/s; PCIe Gen5 128 GB/s.
        nvlink_bandwidth_bytes_per_s=900 * GB,
        pcie_bandwidth_bytes_per_s=128 * GB,
        sources=(
            "NVIDIA H100 Tensor Core GPU datasheet",
            "NVIDIA H100 Tensor Core GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="h100-pcie",
        full_name="NVIDIA H100 PCIe 80GB",
        aliases=("h100-pcie-80gb",),
        arch="hopper",
        compute_capability=(9, 0),
        sm_count=114,
        boost_clock_hz=1755e6,
        # H100 datasheet (PCIe): 80 GB HBM2e at 2 TB/s; 50 MB L2 (whitepaper).
        memory_bytes=80 * 10**9,
        memory_bandwidth_bytes_per_s=2000 * GB,
        l2_bytes=50 * MiB,
        # H100 whitepaper table 2 (PCIe): FP64 25.6, FP64 TC 51.2, FP32 51.2, FP16/BF16
        # non-tensor 102.4, TF32 378, FP16/BF16 756, FP8 1,513, INT8 1,513 TOPS.
        tensor_core_flops={
            "fp64": 51.2 * T,
            "tf32": 378 * T,
            "fp16": 756 * T,
            "bf16": 756 * T,
            "fp8": 1513 * T,
            "int8": 1513 * T,
        },
        cuda_core_flops={"fp64": 25.6 * T, "fp32": 51.2 * T, "fp16": 102.4 * T, "bf16": 102.4 * T},
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(9, 0)],
        # H100 datasheet (PCIe): NVLink bridge 600 GB/s; PCIe Gen5 128 GB/s.
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=128 * GB,
        sources=(
            "NVIDIA H100 Tensor Core GPU datasheet",
            "NVIDIA H100 Tensor Core GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="h200-sxm",
        full_name="NVIDIA H200 SXM 141GB",
        aliases=("h200", "h200-141gb", "h200-sxm5", "h200-sxm-141gb"),
        arch="hopper",
        compute_capability=(9, 0),
        sm_count=132,
        boost_clock_hz=1980e6,
        # H200 datasheet: 141 GB HBM3e at 4.8 TB/s. L2: not on the datasheet; the driver of a
        # lent H200 reported 60 MB (torch L2_cache_size, 2026-10-28).
        memory_bytes=141 * 10**9,
        memory_bandwidth_bytes_per_s=4800 * GB,
        l2_bytes=60 * MiB,
        # H200 datasheet (SXM): FP64 34, FP64 TC 67, FP32 67, TF32 989*, BF16/FP16 1,979*,
        # FP8 3,958*, INT8 3,958* TOPS: the GH100 rates of the H100 SXM5 (whitepaper values).
        tensor_core_flops={
            "fp64": 66.9 * T,
            "tf32": 494.7 * T,
            "fp16": 989.4 * T,
            "bf16": 989.4 * T,
            "fp8": 1978.9 * T,
            "int8": 1978.9 * T,
        },
        cuda_core_flops={"fp64": 33.5 * T, "fp32": 66.9 * T, "fp16": 133.8 * T, "bf16": 133.8 * T},
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(9, 0)],
        # H200 datasheet: NVLink 900 GB/s; PCIe Gen5 128 GB/s.
        nvlink_bandwidth_bytes_per_s=900 * GB,
        pcie_bandwidth_bytes_per_s=128 * GB,
        # Measured on a lent H200 on 2026-11-30, before `gpushape probe` existed (that run's
        # file is not in this repository): copy 4,221 GB/s, bf16 GEMM 795.8 and tf32 438.4
        # TFLOP/s at 8192^3, launch 6.93 us eager, 1.06 us graph. `gpushape probe` measured the
        # same chip that day (benchmarks/results/probe-h200/h200-sxm.json: copy 4,246 GB/s,
        # bf16 767 TFLOP/s, launch 10.0 / 0.83 us); the profile shipped from that run
        # (hardware/profiles/h200-sxm.json) replaces these numbers unless --no-profile.
        achievable=Achievable(
            gemm_fraction={
                "bf16": 795.8 / 989.4,
                "fp16": 795.8 / 989.4,
                "tf32": 438.4 / 494.7,
                "default": 0.8,
            },
            memory_bandwidth_fraction=4221.3 / 4800,
            launch_overhead_s=6.93e-6,
            graph_launch_overhead_s=1.063e-6,
            source="measured: an H200, 2026-11-30 (catalog.py)",
            measured=(
                "gemm_fraction",
                "memory_bandwidth_fraction",
                "launch_overhead_s",
                "graph_launch_overhead_s",
            ),
        ),
        sources=(
            "NVIDIA H200 Tensor Core GPU datasheet",
            "NVIDIA H100 Tensor Core GPU architecture whitepaper",
        ),
    ),
    GPUSpec(
        name="b200",
        full_name="NVIDIA B200 (HGX, 1000 W)",
        aliases=("b200-sxm", "b200-180gb", "hgx-b200"),
        arch="blackwell",
        compute_capability=(10, 0),
        sm_count=148,
        boost_clock_hz=1965e6,
        # HGX B200 datasheet: 180 GB HBM3e at 8 TB/s per GPU. L2: NVIDIA publishes none; 126 MB
        # (two dies) is a third-party figure, used only to size cache flushes.
        memory_bytes=180 * 10**9,
        memory_bandwidth_bytes_per_s=8000 * GB,
        l2_bytes=126 * MiB,
        # HGX B200 datasheet per GPU: FP64/FP64 TC 40, FP32 80, TF32 2.2 PF*, FP16/BF16 4.5 PF*,
        # FP8 9 PF*, INT8 9 POPS*. FP16 non-tensor assumed 2x FP32 (not on the datasheet).
        tensor_core_flops={
            "fp64": 40 * T,
            "tf32": 1100 * T,
            "fp16": 2250 * T,
            "bf16": 2250 * T,
            "fp8": 4500 * T,
            "int8": 4500 * T,
        },
        cuda_core_flops={"fp64": 40 * T, "fp32": 80 * T, "fp16": 160 * T, "bf16": 160 * T},
        tc_align_elems=_ALIGN_16B,
        sm_limits=_SM_LIMITS[(10, 0)],
        # HGX B200 datasheet: NVLink 5 at 1.8 TB/s per GPU; PCIe Gen5 x16 128 GB/s host links.
        nvlink_bandwidth_bytes_per_s=1800 * GB,
        pcie_bandwidth_bytes_per_s=128 * GB,
        sources=("NVIDIA HGX B200 datasheet", "NVIDIA Blackwell architecture technical brief"),
    ),
)
