import dataclasses
import json

import pytest

from gpushape.errors import UnknownGPUError
from gpushape.hardware import CATALOG, DTYPES, GPUSpec, dtype_key, get_gpu, known_names
from gpushape.hardware.lookup import normalize_name

REQUIRED = [
    "v100-sxm2",
    "a100-40gb",
    "a100-80gb",
    "a10",
    "l4",
    "l40s",
    "rtx-3090",
    "rtx-4090",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "b200",
]


def test_catalog_has_the_required_chips():
    assert set(REQUIRED) <= set(known_names())
    assert len(CATALOG) >= 12


@pytest.mark.parametrize("spec", CATALOG, ids=lambda s: s.name)
class TestEveryChip:
    def test_units_are_plausible(self, spec: GPUSpec):
        # Bandwidth in B/s (0.2 - 10 TB/s), memory in bytes (8 - 300 GB), L2 in bytes (1 - 256 MiB):
        # a 1000x slip (GB/s stored as B/s, MB as bytes) lands far outside these windows.
        assert 0.2e12 <= spec.memory_bandwidth_bytes_per_s <= 10e12
        assert 8e9 <= spec.memory_bytes <= 300e9
        assert 2**20 <= spec.l2_bytes <= 256 * 2**20
        assert 40 <= spec.sm_count <= 200
        assert 1e9 <= spec.boost_clock_hz <= 3e9
        assert 10e12 <= spec.cuda_core_flops["fp32"] <= 200e12
        assert 16e9 <= spec.pcie_bandwidth_bytes_per_s <= 512e9

    def test_ridge_point_in_plausible_range(self, spec: GPUSpec):
        # Half-precision tensor-core FLOP per byte of DRAM traffic: every chip since Volta sits
        # between ~50 and ~500; fp32 on CUDA cores between ~10 and ~120.
        half = "bf16" if spec.has_tensor_cores("bf16") else "fp16"
        assert 50 <= spec.ridge_point(half) <= 500
        assert 5 <= spec.ridge_point("fp32", tensor_cores=False) <= 120

    def test_tensor_cores_beat_cuda_cores(self, spec: GPUSpec):
        for dtype, rate in spec.tensor_core_flops.items():
            base = spec.cuda_core_flops.get(
                "fp32" if dtype in ("tf32", "fp8", "int8") else dtype, spec.cuda_core_flops["fp32"]
            )
            assert rate >= base, dtype

    def test_alignment_is_16_bytes_for_tensor_core_dtypes(self, spec: GPUSpec):
        bytes_per = {"fp64": 8, "tf32": 4, "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
        for dtype, elems in spec.tc_align_elems.items():
            assert elems * bytes_per[dtype] == 16
        for dtype in spec.tensor_core_flops:
            assert spec.tc_alignment(dtype) is not None, dtype

    def test_achievable_fractions_are_fractions(self, spec: GPUSpec):
        a = spec.achievable
        assert 0.3 < a.memory_bandwidth_fraction <= 1.0
        assert all(0.3 < f <= 1.0 for f in a.gemm_fraction.values())
        assert 0 < a.graph_launch_overhead_s < a.launch_overhead_s < 50e-6

    def test_sources_are_named(self, spec: GPUSpec):
        assert spec.sources and all(s.strip() for s in spec.sources)

    def test_name_and_aliases_resolve_to_itself(self, spec: GPUSpec):
        for name in (spec.name, spec.full_name, *spec.aliases):
            assert get_gpu(name) is spec
            assert get_gpu(name.upper()) is spec

    def test_to_dict_is_json(self, spec: GPUSpec):
        data = json.loads(json.dumps(spec.to_dict()))
        assert data["name"] == spec.name
        assert data["tensor_core_flops"] == dict(spec.tensor_core_flops)


def test_h200_numbers_from_the_issue():
    h200 = get_gpu("h200")
    assert h200.memory_bandwidth_bytes_per_s == 4.8e12
    assert h200.peak_flops("bf16") == pytest.approx(989e12, rel=0.01)
    assert h200.sm_count == 132


@pytest.mark.parametrize(
    "alias, name",
    [
        ("h100", "h100-sxm"),
        ("H100-SXM5-80GB", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("nvidia h200", "h200-sxm"),
        ("NVIDIA H200", "h200-sxm"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA L40S", "l40s"),
        ("h100_pcie", "h100-pcie"),
    ],
)
def test_aliases_and_driver_names(alias, name):
    assert get_gpu(alias).name == name


def test_unknown_name_lists_the_known_chips():
    with pytest.raises(UnknownGPUError) as err:
        get_gpu("h300")
    message = str(err.value)
    assert "'h300'" in message and "\n" not in message
    for name in REQUIRED:
        assert name in message


def test_normalize_name_strips_vendor_words():
    assert normalize_name("NVIDIA GeForce RTX 3090") == "rtx-3090"
    assert normalize_name("  Tesla  V100 ") == "v100"


def test_peak_flops_falls_back_sensibly():
    v100 = get_gpu("v100")
    assert v100.peak_flops("fp32") == v100.cuda_core_flops["fp32"]  # no TF32 on Volta
    assert v100.peak_flops("bf16") == v100.cuda_core_flops["fp32"]  # no bf16 path at all
    h100 = get_gpu("h100")
    assert h100.peak_flops("fp32") == h100.tensor_core_flops["tf32"]
    assert h100.peak_flops("fp32", tensor_cores=False) == h100.cuda_core_flops["fp32"]
    assert h100.attainable_flops("bf16") < h100.peak_flops("bf16")


def test_dtype_key():
    import torch

    assert dtype_key(torch.bfloat16) == "bf16"
    assert dtype_key("float16") == "fp16"
    assert dtype_key("FP32") == "fp32"
    assert set(DTYPES) == {dtype_key(d) for d in DTYPES}
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_key("complex64")


def test_spec_is_frozen_and_replace_records_origin():
    h100 = get_gpu("h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        h100.sm_count = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        h100.tensor_core_flops["bf16"] = 1.0  # type: ignore[index]
    changed = h100.replace(note="driver", sm_count=130)
    assert changed.sm_count == 130 and changed.overridden["sm_count"] == "driver"
    assert h100.sm_count == 132
