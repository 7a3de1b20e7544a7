"""benchmarks/steps/roofline_step.py on the CPU: each kernel name the H200 runs in a ResNet-50
step lands in its class, and a class's roofline comes from the variant's trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "steps"))
from roofline_step import COMPUTE, kernel_class, rooflines

from gpushape.hardware import calibrated
from gpushape.models import create_model


@pytest.mark.parametrize(
    ("name", "cls"),
    [  # names from the H200's profiles (bench-h200/*.json top kernels)
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>", "layout"),
        ("void at::native::batch_norm_backward_kernel<c10::BFloat16, float, int>", "normalization"),
        ("_bwd_apply_kernel", "normalization"),
        ("triton_poi_fused__native_batch_norm_legit_functional_add_convolution_backward_3",
         "normalization"),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
         "convolution"),
        ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16>",
         "convolution"),
        ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32", "convolution"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "matmul"),
        ("void at::native::(anonymous namespace)::max_pool_backward_nhwc<float>", "pooling"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", "optimizer"),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add>",
         "elementwise"),
        ("some_unknown_kernel", "other"),
    ],
)  # fmt: skip
def test_kernel_names_land_in_their_class(name, cls):
    assert kernel_class(name) == cls


def test_rooflines_price_compute_at_the_gemm_peak_and_the_rest_at_the_copy_rate():
    model, (x,) = create_model("resnet50", batch=4, blocks=(1, 1, 1, 1), width=8)
    spec = calibrated("h200")
    roof = rooflines(model, (x,), spec)
    assert {"convolution", "normalization", "elementwise", "optimizer"} <= set(roof)
    assert all(v >= 0 for v in roof.values()) and roof["convolution"] > 0
    assert set(COMPUTE) == {"convolution", "matmul"}
    # the optimizer's floor: 5 passes over the parameters' bytes at the copy rate
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert roof["optimizer"] == pytest.approx(5 * nbytes / spec.attainable_bandwidth_bytes_per_s())
    assert torch.is_tensor(x)
