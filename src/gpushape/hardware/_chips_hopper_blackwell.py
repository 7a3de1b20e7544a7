"""The catalog's Hopper and Blackwell chips (H100 SXM and PCIe, H200, B200), each number with
its source (conventions in `catalog.py`'s docstring); the H200 with fractions measured on one."""

from __future__ import annotations

from ._arch_limits import ALIGN_16B, GB, SM_LIMITS, MiB, T
from .spec import Achievable, GPUSpec

CHIPS: tuple[GPUSpec, ...] = (
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(9, 0)],
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(9, 0)],
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(9, 0)],
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(10, 0)],
        # HGX B200 datasheet: NVLink 5 at 1.8 TB/s per GPU; PCIe Gen5 x16 128 GB/s host links.
        nvlink_bandwidth_bytes_per_s=1800 * GB,
        pcie_bandwidth_bytes_per_s=128 * GB,
        sources=("NVIDIA HGX B200 datasheet", "NVIDIA Blackwell architecture technical brief"),
    ),
)
