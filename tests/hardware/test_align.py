"""align(): the smallest size the chip's tensor cores take at full speed, from the GPUSpec's
alignment (the catalog's 16 bytes, or a profile's measured cliff)."""

from __future__ import annotations

import pytest
import torch

import gpushape.hardware.alignment as alignment
from gpushape.errors import GpushapeError, UnknownGPUError
from gpushape.hardware import align, calibrated, get_gpu
from gpushape.hardware.alignment import AlignError, granularity, round_up


@pytest.mark.parametrize(
    ("n", "kind", "dtype", "expected"),
    [
        (50257, "gemm", "bf16", 50264),  # GPT-2's vocabulary
        (50257, "vocab", "bf16", 50264),
        (4096, "gemm", "bf16", 4096),
        (1, "gemm", "bf16", 8),
        (4095, "gemm", torch.float16, 4096),
        (1001, "gemm", "fp32", 1004),
        (1001, "gemm", "tf32", 1004),
        (63, "conv", "fp32", 64),
        (1001, "gemm", "fp8", 1008),
        (50, "heads", "bf16", 56),
        (60, "heads", "fp32", 64),  # fused SDPA kernels: a multiple of 8 in every dtype
        (64, "heads", "bf16", 64),
    ],
)
def test_h200_catalog(n, kind, dtype, expected):
    assert align(n, kind, gpu="h200", dtype=dtype) == expected


def test_catalog_numbers_are_16_bytes():
    spec = get_gpu("h200")
    for dtype, elems in {"bf16": 8, "fp16": 8, "fp32": 4, "tf32": 4, "fp8": 16}.items():
        assert spec.tc_alignment(dtype) == elems
        assert granularity("gemm", spec, dtype) == elems


def test_no_tensor_cores_for_the_dtype_keeps_the_size():
    assert align(1001, gpu="a100", dtype="fp8") == 1001  # Ampere: no fp8 tensor cores
    assert align(1001, gpu="v100", dtype="bf16") == 1001  # Volta: fp16 only
    assert align(1001, gpu="v100", dtype="fp16") == 1008
    assert align(60, "heads", gpu="v100", dtype="bf16") == 64  # SDPA's rule still holds


def test_a_calibrated_spec_carries_the_measured_alignment():
    """The H200 profile measured no fp32 cliff (CUDA-core GEMMs), TF32 at 4 elements: a fp32
    matmul stays, a fp32 convolution (TF32 by cuDNN's default) pads to 4."""
    spec = calibrated(get_gpu("h200"))
    assert spec.tc_alignment("fp32") == 1
    assert align(1001, "gemm", spec, "fp32") == 1001
    assert align(1001, "conv", spec, "fp32") == 1004
    assert align(50257, "vocab", spec, "bf16") == 50264


def test_default_gpu_is_the_one_present_else_h100(monkeypatch):
    monkeypatch.setattr(alignment, "current_gpu", lambda: None)
    assert alignment.target_gpu().name == get_gpu("h100").name
    assert align(1001) == 1008

    def unknown():
        raise UnknownGPUError("unknown GPU 'x'")

    monkeypatch.setattr(alignment, "current_gpu", unknown)
    assert alignment.target_gpu().name == get_gpu("h100").name
    monkeypatch.setattr(alignment, "current_gpu", lambda: get_gpu("v100"))
    assert align(1001, dtype="bf16") == 1001  # the V100 found here: no bf16 tensor cores


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((0,), "at least 1"),
        ((-8,), "at least 1"),
        ((True,), "at least 1"),
        ((8.5,), "whole number"),
        (("64",), "whole number"),
        ((64, "matmul"), "unknown dimension kind 'matmul'"),
        ((64, "gemm", "h200", "complex64"), "unknown dtype"),
    ],
)
def test_bad_arguments_raise_align_error(args, words):
    with pytest.raises(AlignError, match=words) as info:
        align(*args)
    assert isinstance(info.value, GpushapeError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_unknown_gpu():
    with pytest.raises(UnknownGPUError):
        align(64, gpu="no-such-chip")


def test_round_up():
    assert [round_up(n, 8) for n in (1, 7, 8, 9, 16)] == [8, 8, 8, 16, 16]
    assert round_up(1001, 1) == 1001
