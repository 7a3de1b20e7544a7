"""The catalog's Volta, Ampere and Ada chips (V100 to RTX 4090), each number with its source
(conventions in `catalog.py`'s docstring)."""

from __future__ import annotations

from ._arch_limits import ALIGN_16B, ALIGN_AMPERE, ALIGN_VOLTA, GB, SM_LIMITS, MiB, T
from .spec import GPUSpec

CHIPS: tuple[GPUSpec, ...] = (
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
        tc_align_elems=ALIGN_VOLTA,
        sm_limits=SM_LIMITS[(7, 0)],
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
        tc_align_elems=ALIGN_AMPERE,
        sm_limits=SM_LIMITS[(8, 0)],
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
        tc_align_elems=ALIGN_AMPERE,
        sm_limits=SM_LIMITS[(8, 0)],
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
        tc_align_elems=ALIGN_AMPERE,
        sm_limits=SM_LIMITS[(8, 6)],
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(8, 9)],
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(8, 9)],
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
        tc_align_elems=ALIGN_AMPERE,
        sm_limits=SM_LIMITS[(8, 6)],
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
        tc_align_elems=ALIGN_16B,
        sm_limits=SM_LIMITS[(8, 9)],
        nvlink_bandwidth_bytes_per_s=None,
        pcie_bandwidth_bytes_per_s=64 * GB,
        sources=("NVIDIA Ada GPU architecture whitepaper",),
    ),
)
