"""The GEMM efficiency model: tile and wave quantization, split-K, alignment, H200 anchors."""

from __future__ import annotations

import math

import pytest

from gpushape.hardware import get_gpu
from gpushape.tracing.flops.registry import Gemm
from gpushape.tracing.gemm_model import (
    CONV_MISALIGNED,
    GEMM_MISALIGNED,
    GEMM_MISALIGNED_WORST,
    LARGE_TILES,
    gemm_efficiency,
)

H200 = get_gpu("h200")


def _gemm(m, n, k, align=(), family="gemm", batch=1):
    return Gemm(
        m=m, n=n, k=k, batch=batch, flops=2 * m * n * k * batch, family=family, align_dims=align
    )


def test_the_reference_shape_has_efficiency_one():
    assert gemm_efficiency(_gemm(8192, 8192, 8192), H200, "bf16").efficiency == 1.0


def test_tile_quantization_counts_partial_edge_tiles_as_whole():
    gpu = H200.replace(sm_count=10_000)  # so many SMs that waves never quantize
    e = gemm_efficiency(_gemm(129, 129, 4096), gpu, "bf16")
    bm, bn = e.tile
    assert e.tile_eff == pytest.approx(
        129 * 129 / (math.ceil(129 / bm) * bm * math.ceil(129 / bn) * bn)
    )
    assert e.tile_eff < 0.6  # 129 rows fill one 128-row tile and 1/128 of a second


def test_wave_quantization_a_partial_last_wave_costs_a_whole_wave():
    # 8 tiles of 128x256, 16 of 128x128, 32 of 128x64; K too shallow for stream-K
    gemm = _gemm(512, 512, 512)
    full = gemm_efficiency(gemm, H200.replace(sm_count=8), "bf16")
    assert full.wave_eff == pytest.approx(1.0) and full.last_wave_fill == 1.0
    for sms in (7, 9, 11):  # no tile count divides evenly
        e = gemm_efficiency(gemm, H200.replace(sm_count=sms), "bf16")
        assert e.waves == math.ceil(e.ctas / sms)
        assert e.wave_eff == pytest.approx(e.ctas / (e.waves * sms)) and e.wave_eff < 1.0
        assert e.last_wave_fill < 1.0


def test_split_k_fills_the_gpu_for_deep_narrow_weight_gradients():
    e = gemm_efficiency(_gemm(256, 576, 200_704), H200, "bf16")  # M=Cout, N=Cin x 9, K=N x HW
    assert e.split_k > 1 and e.wave_eff > 0.8
    skinny = gemm_efficiency(_gemm(128, 4096, 4096), H200, "bf16")  # not deep: no split
    assert skinny.split_k == 1


def test_stream_k_shares_a_deep_gemms_k_loops_over_one_wave():
    """An MLP's weight gradient (768 x 3072 outputs over 8192 rows): 72 large tiles, half a
    wave; the K loops shared out in chunks fill the wave (cuBLAS's Hopper kernels do; the
    H200 ran GPT-2's MLP Linear modules at 0.97-1.0x the time this prices)."""
    e = gemm_efficiency(_gemm(768, 3072, 8192), H200, "bf16")
    assert e.waves == 1 and e.ctas == H200.sm_count and e.split_k == 2
    chunks = 72 * (8192 // 256)
    assert e.wave_eff == pytest.approx(chunks / (math.ceil(chunks / 132) * 132))
    shallow = gemm_efficiency(_gemm(768, 3072, 4096), H200, "bf16")  # K < 2 max(M, N)
    assert shallow.split_k == 1 and shallow.wave_eff == pytest.approx(72 / 132)


@pytest.mark.parametrize(
    "k,penalty",
    [
        (4096, 1.0),
        (4104, 1.0),  # multiples of 8 bf16 elements (16 bytes)
        (4100, GEMM_MISALIGNED[2]),  # 8-byte aligned
        (4098, GEMM_MISALIGNED[4]),  # 4-byte aligned
        (4095, GEMM_MISALIGNED_WORST),
        (4097, GEMM_MISALIGNED_WORST),
    ],
)
def test_alignment_penalty_by_how_far_the_dimension_misses(k, penalty):
    e = gemm_efficiency(_gemm(8192, 8192, k, align=(("K", k),)), H200, "bf16")
    assert e.alignment == pytest.approx(penalty)
    assert e.misaligned == (() if penalty == 1.0 else (f"K={k}",))


def test_alignment_follows_the_dtype_rule_and_needs_tensor_cores():
    gemm = _gemm(8192, 8192, 4100, align=(("K", 4100),))
    assert gemm_efficiency(gemm, H200, "tf32").alignment == 1.0  # 4 tf32 elements = 16 bytes
    assert gemm_efficiency(gemm, H200, "bf16", tensor_cores=False).alignment == 1.0
    conv = _gemm(8192, 63, 63 * 9, align=(("Cin/groups", 63), ("Cout/groups", 64)), family="conv")
    assert gemm_efficiency(conv, H200, "bf16").alignment == CONV_MISALIGNED
    # several misaligned dims: the worst one, not the product
    two = _gemm(8192, 8192, 8192, align=(("K", 4095), ("N", 4100)))
    assert gemm_efficiency(two, H200, "bf16").alignment == GEMM_MISALIGNED_WORST


def test_attention_tiles_only_the_row_dimension():
    e = gemm_efficiency(_gemm(1024, 1024, 64, family="attention", batch=12), H200, "bf16")
    assert e.ctas == 12 * 8 and e.tile_eff == 1.0 and e.alignment == 1.0


# H200 bf16 TFLOP/s measured 2026-11-30 (benchmarks/results/baselines-h200/h200-2026-11-30.json,
# torch 2.11, CUDA 13): square N^3 GEMMs and M = N = 8192 with K varying. The model must
# predict each rate relative to the aligned neighbour within 15%.
SQUARE = {4095: 147.9, 4096: 736.7, 4097: 131.8, 4100: 210.9, 4104: 680.9, 4112: 689.2}
K_SWEEP = {1023: 135.2, 1024: 663.3, 1025: 136.8, 1028: 236.0, 1032: 630.3, 1040: 638.8}


def _predicted(m, n, k):
    align = (("K", k), ("N", n))  # row-major operands: leading dims K (A) and N (B, C)
    return gemm_efficiency(_gemm(m, n, k, align=align), H200, "bf16").efficiency


@pytest.mark.parametrize("n", sorted(SQUARE))
def test_square_anchor(n):
    measured = SQUARE[n] / SQUARE[4096]
    predicted = _predicted(n, n, n) / _predicted(4096, 4096, 4096)
    assert predicted == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize("k", sorted(K_SWEEP))
def test_k_anchor(k):
    measured = K_SWEEP[k] / K_SWEEP[1024]
    predicted = _predicted(8192, 8192, k) / _predicted(8192, 8192, 1024)
    assert predicted == pytest.approx(measured, rel=0.15)


def test_a_measured_small_cin_rate_prices_convolutions_on_few_channels():
    """Fewer input channels per group than the alignment (an RGB stem) take the measured rate
    when the profile has one; 63 channels keep the generic convolution penalty."""
    import dataclasses

    from gpushape.tracing.flops.registry import Gemm
    from gpushape.tracing.gemm_model import CONV_MISALIGNED, gemm_efficiency

    h200 = get_gpu("h200")
    stem = Gemm(
        m=802816,
        n=64,
        k=147,
        flops=2 * 802816 * 64 * 147,
        family="conv",
        align_dims=(("Cin/groups", 3), ("Cout/groups", 64)),
    )
    wide = dataclasses.replace(stem, align_dims=(("Cin/groups", 63), ("Cout/groups", 64)))
    assert gemm_efficiency(stem, h200, "bf16").alignment == CONV_MISALIGNED
    measured = h200.replace(achievable=dataclasses.replace(h200.achievable, small_cin_conv=0.07))
    assert gemm_efficiency(stem, measured, "bf16").alignment == 0.07
    assert gemm_efficiency(wide, measured, "bf16").alignment == CONV_MISALIGNED


def test_a_matrix_product_runs_cublas_large_tiles_where_they_give_half_a_wave():
    """BERT's 8192 x 768 x 768: 192 tiles of 256x128 (1.45 waves on 132 SMs), as cuBLAS ran it
    on the H200 (nvjet_sm90_tst_256x128, bench-h200/kernels-bert.json), not 384 of 128x128;
    against the reference shape on the same tiles (2048 of them, 16 waves)."""
    e = gemm_efficiency(_gemm(8192, 768, 768), H200, "bf16")
    assert e.tile in LARGE_TILES and e.ctas == 192 and e.waves == 2
    assert e.efficiency == pytest.approx((192 / 264) / (2048 / 2112))


def test_large_tiles_leave_skinny_products_batched_ones_and_convolutions():
    assert gemm_efficiency(_gemm(128, 4096, 4096), H200, "bf16").tile not in LARGE_TILES
    batched = gemm_efficiency(_gemm(49, 49, 32, batch=12288), H200, "bf16")  # Swin's windows
    conv = gemm_efficiency(_gemm(8192, 768, 768, family="conv"), H200, "bf16")
    assert batched.tile not in LARGE_TILES and conv.tile == (128, 128)
    assert conv.efficiency > 0.98


def test_a_downsampling_patch_convolution_takes_its_measured_rate():
    """ConvNeXt's 2x2/2 downsampling on 96 channels: the rate measured for side 2 ("1" where
    unmeasured); a 3-channel patch embedding and an ordinary convolution keep theirs."""
    import dataclasses

    def conv(cin, patch):
        align = (("Cin/groups", cin), ("Cout/groups", 192))
        return Gemm(
            m=50176, n=192, k=cin * 4, flops=1, family="conv", align_dims=align, patch=patch
        )

    measured = H200.replace(
        achievable=dataclasses.replace(
            H200.achievable, memory_efficiency={"downsample_conv@2": 0.2}
        )
    )
    plain = gemm_efficiency(conv(96, 2), H200, "bf16")
    slow = gemm_efficiency(conv(96, 2), measured, "bf16")
    assert plain.kernel_rate == 1.0 and slow.kernel_rate == 0.2
    assert slow.efficiency == pytest.approx(0.2 * plain.efficiency)
    assert gemm_efficiency(conv(96, 0), measured, "bf16").kernel_rate == 1.0
    assert gemm_efficiency(conv(3, 4), measured, "bf16").kernel_rate == 1.0
