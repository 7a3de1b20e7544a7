"""GEMM efficiency: the fraction of a GPU's attainable tensor-core rate one GEMM-shaped kernel gets.

    efficiency = quantization(shape) / quantization(reference shape) x alignment(dims)
                 x measured kernel rate (fused attention only)

`gpu.attainable_flops(dtype)` is what a large aligned GEMM reaches (datasheet peak x a GEMM
fraction, assumed or measured by `gpushape probe` at 8192^3); this model scales it for the
shape at hand. It has five parts.

1. Tile quantization. cuBLAS and cuDNN cover the M x N output with BM x BN tiles, one thread
   block (CTA) each, and a partial tile at an edge costs a whole one:
       tiles = ceil(M / BM) x ceil(N / BN) x batch
       tile_eff = M N / (ceil(M / BM) BM x ceil(N / BN) BN)
   The library picks among tile shapes; we take the best of TILES (128x256, 256x128, 128x128,
   128x64, 64x128: the shapes Hopper and Ampere cuBLAS/CUTLASS kernels use; the H200 profile's
   conv kernels report `tilesize128x128x64`). K is not tiled into waste: its remainder is a
   short last step. A matrix product (not batched, not a convolution or attention) that gives
   LARGE_TILES (256x128, 128x256) at least half a wave runs on one of them even where a
   smaller tile would quantize better (fewer large tiles: a skinny product, where cuBLAS
   turns to smaller tiles or split-K, kept on TILES). cuBLAS on the H200 ran BERT's and
   LLaMA's projections as nvjet_sm90_tst_256x128 / 128x256 cooperative kernels (two-SM
   clusters) and 128x128 only with split-K, for weight gradients that fill no wave
   (benchmarks/results/bench-h200/kernels-bert.json top kernels,
   kernels-h200/probe_qkv_gemms.log). At 8192 x 768 x 768 that is 192 tiles, 1.45 waves: BERT's
   768-wide Linear layers took 0.07-0.08 ms a module where the best tile (128x128, 2.9 waves)
   priced 0.045-0.055 (correlate-h200/correlate-lib.json).
2. Wave quantization. CTAs run in waves of `gpu.sm_count`, one per SM (these large-tile kernels
   fill an SM's shared memory), and a partly filled last wave takes as long as a full one:
       waves = ceil(ctas / sm_count), wave_eff = ctas / (waves x sm_count)
   Split-K: when the tiles do not fill one wave and the GEMM is deep
   (K >= SPLIT_K_DEPTH_RATIO x max(M, N), as weight gradients are: M = Cout, N = Cin x taps,
   K = batch x positions), the library shares the tiles' K loops, in chunks of
   SPLIT_K_MIN_DEPTH, out evenly over one wave of CTAs (stream-K; cuBLAS's Hopper kernels do,
   and split-K does nearly as well): wave_eff = chunks / (ceil(chunks / sm_count) x sm_count).
   An earlier rule split K only in whole multiples of the tiles and only at K >= 4 max(M, N);
   it priced the MLP weight gradients of GPT-2, BERT, ViT and LLaMA (768 x 3072 outputs over
   8192-16384 rows: 72 large tiles) at 0.55 of the rate, and their Linear modules at
   1.16-1.24x their measured time on the H200; with stream-K, 0.98-1.05x
   (correlate-h200/correlate-lib.json). A skinny GEMM without a deep K gets no split: the
   H200 ran M=128, N=K=4096 in 14.6 us, which its 64 CTAs of 128x64 and the kernel latency
   (part 5) price at 14.7.
   Attention kernels give one CTA to each (batch x head, block of ATTENTION_BLOCK_ROWS query
   rows) forward, key rows backward; only the row dimension is tiled.
   Quantization = tile_eff x wave_eff, divided by its value at the reference shape (8192^3,
   where the GEMM fraction is measured), so the reference shape has efficiency 1.
3. Tensor-core alignment. The fast path needs every leading dimension (and a convolution's
   channels per group) to be a multiple of `gpu.tc_alignment(dtype)` elements (16 bytes). A
   dimension that misses it runs a slower kernel. Its penalty depends on how far it misses:
   the dimension's largest power-of-two byte alignment as a fraction of the 16 required.
   Calibrated on the H200 baselines (benchmarks/results/baselines-h200/h200-2026-11-30.json,
   bf16 TFLOP/s, torch 2.11 / cuBLAS of CUDA 13), dividing out this model's own quantization change:
       half aligned (8 of 16 bytes): K=1028 236.0 vs K=1024 663.3 -> 0.356;
         square 4100 210.9 vs 4096 736.7, model quantization 0.943 -> 0.304;     mean 0.33
       odd (2 of 16 bytes): K=1023 135.2, K=1025 136.8 -> 0.204, 0.206;
         square 4095 147.9 -> 0.201, 4097 131.8 -> 0.190 (quantization 0.942);  mean 0.20
       quarter aligned (4 of 16 bytes): BERT's MLM decoder (N = 30522, batch 32 x 512) in
         an eager step ran its three GEMMs as cuBLAS's align2 kernels in 3.27, 3.12 and 2.93
         ms (benchmarks/results/bench-h200/kernels-bert.json) against 1.01, 1.00 and 1.08
         this model predicts for N = 30528 -> 0.31, 0.32, 0.37; `gpushape probe`'s K sweep,
         K a multiple of 2 and not 4: 0.35 of the aligned rate (h200-sxm.json, cliffs);
         mean 0.33, as half aligned (an earlier 0.26, unanchored, overpriced padding BERT's
         vocabulary 2.4x: 8.3 ms predicted, 3.7 ms measured)
     M alone misaligned costs nothing (M = 127/128/129 and 2047/2048/2049 run alike), which is
     why only leading dimensions count. Several misaligned dimensions cost the worst one's
     penalty, not the product (square 4095, all three dims odd, matches K=1023 alone).
   Convolutions (cuDNN implicit GEMM) fall back more gently: a 3x3 conv with 63 input
   channels ran at 169.1 against 242.3 TFLOP/s with 64 -> CONV_MISALIGNED = 0.70, applied to
   any misalignment of channels per group (no anchor separates half from odd there).
   A convolution with fewer input channels per group than the alignment (the RGB stem of
   every CNN: 3 channels) falls much further, to what `gpushape probe` measures for a 7x7
   stride-2 stem (`Achievable.small_cin_conv`, the measured rate over this model's rate with
   no penalty); unmeasured, it takes CONV_MISALIGNED. A stem at another stride takes the rate
   measured at the stride nearest its own ("small_cin_conv@<stride>", `Gemm.stride`): on an
   H100 PoolFormerV2's 7x7/4 stem ran its forward in 0.29 ms where the stride-2 rate priced
   it at 0.11 (a quarter of the multiply-adds did not take a quarter of the time).
   A patch embedding (`Gemm.patch`: stride
   equal to the kernel, ViT's 16x16/16, ConvNeXt's 4x4/4) runs other cuDNN kernels: it takes the
   rate the probe measured for the patch side nearest its own (profile keys "patch_conv@<side>",
   `small_cin_rate`), the stem's where none is measured.
   A patch convolution on aligned channels (ConvNeXt's 2x2/2 downsampling between stages,
   96 -> 192 channels) runs other cuDNN kernels again: the H200 took 0.26 ms a training step for
   ConvNeXt-T's first (64 x 96 x 56 x 56), where this model gives 0.036 (correlate-lib.json). It
   takes the rate measured for the nearest side (profile keys "downsample_conv@<side>",
   `downsample_rate`, forward and both gradients); 1 where none is measured.
   s2d-stem's convolution (a stem folded into 16 channels, 4x4 at stride 1) is aligned, but
   cuDNN runs its narrow GEMMs far below this model's rate: its GEMMs carry `rate_key`, and
   run at the rate the probe measured for that convolution at the nearest folded kernel side
   (profile keys "s2d_stem" at side 4, "s2d_stem@2"; the model's rate where none is measured).
   These are one chip's measurements, used for every chip until `gpushape probe` measures its
   own cliffs.
4. Fused attention kernels (flash, memory-efficient) do more than their two or five matmuls:
   online softmax and rescaling, the backward's recomputation, Philox for dropout, and at head
   size 64 thin tiles. Their efficiency is multiplied by the rate `gpushape probe` measured for
   the kernel's backend, pass, dropout and causal flags at the nearest head size, by the
   call's sequence length where measured at several (`Achievable.attention_rate`,
   probe/attention.py; 1 where unmeasured).
5. Kernel latency. Each matrix product or convolution kernel takes `gemm_latency_s` beyond its
   FLOPs at this rate (`LATENCY_FAMILIES`; cost.py adds it): filling the pipeline before the
   first MMA, the last tiles' epilogue, SMs that finish at different times. Small GEMMs are
   mostly this. `gpushape probe` fits it on its bf16 GEMM sweeps (probe/profile.py
   `fit_gemm_latency`): the median |log(predicted / measured)| of the GEMMs under 100 us in
   the shipped H200 profile's sweeps was 0.22 without it and 0.09 with the 3.25 us fitted, in
   the H100 probe's 0.32 and 0.11 (3.5 us). BERT's 768-wide projections in a training step
   (correlate-h200/correlate-lib.json) went from 0.77-0.79x their measured time to 0.98-1.01x,
   which is what fusing three of them into one saves beyond their FLOPs. Fused attention's
   rates are measured per kernel (part 4) and include it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import GPUSpec
from .families import DOWNSAMPLE_CONV, PATCH_CONV, STEM_CONV, STEM_STRIDE, nearest_size
from .flops.conv import S2D_STEM_SIDE
from .flops.registry import Gemm

TILES = ((128, 256), (256, 128), (128, 128), (128, 64), (64, 128))
LARGE_TILES = ((256, 128), (128, 256))  # a matrix product's, where they fill half a wave
LARGE_TILES_MIN_WAVE = 0.5
ATTENTION_BLOCK_ROWS = 128
SPLIT_K_MIN_DEPTH = 256
SPLIT_K_DEPTH_RATIO = 2
REFERENCE_GEMM = (8192, 8192, 8192)
LATENCY_FAMILIES = ("gemm", "conv")  # kernels that pay `Achievable.gemm_latency_s` (part 5)

# Penalty by the fraction of the required 16-byte alignment a dimension reaches (see above).
GEMM_MISALIGNED = {2: 0.33, 4: 0.33}  # 1/2 aligned, 1/4 aligned
GEMM_MISALIGNED_WORST = 0.20  # 1/8 or less (odd bf16/fp16 dimensions)
CONV_MISALIGNED = 0.70


@dataclass(frozen=True, slots=True)
class GemmEfficiency:
    """How well one GEMM fits the GPU, and why."""

    gemm: Gemm
    sm_count: int
    tile: tuple[int, int]  # (BM, BN) chosen; (rows, 0) for attention
    ctas: int  # thread blocks launched (tiles x splits)
    split_k: int
    waves: int
    tile_eff: float
    wave_eff: float
    alignment: float  # 1.0, or the misalignment penalty
    misaligned: tuple[str, ...]  # "K=4095" for each dimension that misses the alignment
    efficiency: float  # quantization (relative to the reference shape) x alignment x kernel_rate
    # fused attention, a downsampling patch convolution: the rate measured for its kernel
    kernel_rate: float = 1.0

    @property
    def last_wave_fill(self) -> float:
        """Fraction of SMs busy in the last wave (1.0: full)."""
        if self.waves == 0:
            return 1.0
        return (self.ctas - (self.waves - 1) * self.sm_count) / self.sm_count


def _quantize(m: int, n: int, k: int, batch: int, sms: int, bm: int, bn: int):
    tiles_m, tiles_n = math.ceil(m / bm), math.ceil(n / bn)
    tile_eff = (m * n) / (tiles_m * bm * tiles_n * bn)
    tiles = tiles_m * tiles_n * batch
    if tiles < sms and k >= SPLIT_K_DEPTH_RATIO * max(m, n):
        # stream-K: the tiles' K loops, in chunks, shared out evenly over one wave of CTAs
        units = tiles * max(1, k // SPLIT_K_MIN_DEPTH)
        ctas = min(units, sms)
        return tile_eff, units / (math.ceil(units / sms) * sms), ctas, math.ceil(ctas / tiles), 1
    ctas = tiles
    waves = math.ceil(ctas / sms)
    return tile_eff, ctas / (waves * sms), ctas, 1, waves


def _best_tile(gemm: Gemm, sms: int):
    if gemm.family == "attention":
        rows = ATTENTION_BLOCK_ROWS
        blocks = math.ceil(gemm.m / rows)
        ctas = blocks * gemm.batch
        waves = math.ceil(ctas / sms)
        return (rows, 0), gemm.m / (blocks * rows), ctas / (waves * sms), ctas, 1, waves
    return _best_of(gemm, sms, LARGE_TILES if _large_tiles(gemm, sms) else TILES)


def _large_tiles(gemm: Gemm, sms: int) -> bool:
    """Whether cuBLAS runs `gemm` on LARGE_TILES: a matrix product they give half a wave."""
    if gemm.family != "gemm" or gemm.batch != 1:
        return False
    return _best_of(gemm, sms, LARGE_TILES)[3] >= LARGE_TILES_MIN_WAVE * sms


def _best_of(gemm: Gemm, sms: int, tiles: tuple[tuple[int, int], ...]):
    best = None
    for bm, bn in tiles:
        tile_eff, wave_eff, ctas, split, waves = _quantize(
            gemm.m, gemm.n, gemm.k, gemm.batch, sms, bm, bn
        )
        if best is None or tile_eff * wave_eff > best[1] * best[2] + 1e-12:
            best = ((bm, bn), tile_eff, wave_eff, ctas, split, waves)
    return best


def _reference(sms: int, large: bool) -> float:
    """Quantization at the reference shape under one tile rule (LARGE_TILES where they fill a
    wave, or the best of TILES), so the shape the GEMM fraction is measured at has efficiency
    1 under either."""
    m, n, k = REFERENCE_GEMM
    tiles = LARGE_TILES if large else TILES
    _, tile_eff, wave_eff, *_ = _best_of(Gemm(m=m, n=n, k=k, flops=2 * m * n * k), sms, tiles)
    return tile_eff * wave_eff


def alignment_penalty(
    value: int, align_elems: int, family: str, small_cin_conv: float = 0.0
) -> float:
    """1.0 if `value` is a multiple of `align_elems`, else the calibrated penalty.
    `small_cin_conv`: the measured rate of a convolution whose channels per group are fewer
    than `align_elems` (0: not measured, the generic convolution penalty)."""
    if value <= 0 or value % align_elems == 0:
        return 1.0
    if family == "conv":
        if 0 < value < align_elems and small_cin_conv > 0:
            return small_cin_conv
        return CONV_MISALIGNED
    reached = math.gcd(value, align_elems)  # elements of alignment the dimension has
    return GEMM_MISALIGNED.get(align_elems // reached, GEMM_MISALIGNED_WORST)


def small_cin_rate(gemm: Gemm, gpu: GPUSpec) -> float:
    """The measured rate of a convolution on fewer input channels than the alignment: a patch
    embedding's at the measured patch side nearest its own, else the stem's at the measured
    stride nearest its own by ratio (`conv_small_cin` is stride 2's, "small_cin_conv@<s>"
    the others'); 0: unmeasured."""
    measured = gpu.achievable.memory_efficiency
    if gemm.patch:
        key = nearest_size(PATCH_CONV, measured, gemm.patch, gemm.patch)
        if key in measured:
            return measured[key]
    strides = {
        int(side): rate
        for key, rate in measured.items()
        for family, _, side in [key.partition("@")]
        if family == STEM_CONV and side.isdigit()
    }
    if gemm.stride <= 0 or not strides:
        return gpu.achievable.small_cin_conv
    if gpu.achievable.small_cin_conv > 0:
        strides.setdefault(STEM_STRIDE, gpu.achievable.small_cin_conv)
    nearest = min(strides, key=lambda s: (abs(math.log(s / gemm.stride)), s))
    return strides[nearest]


def measured_rate(key: str, gpu: GPUSpec) -> float:
    """The rate measured for a GEMM's own kernel, `Gemm.rate_key` "<family>@<side>": the
    family's measurement at the side nearest (its own figure at S2D_STEM_SIDE); 1: none."""
    family, _, side = key.partition("@")
    measured = gpu.achievable.memory_efficiency
    if not side.isdigit():
        return measured.get(key, 1.0)
    return measured.get(nearest_size(family, measured, int(side), S2D_STEM_SIDE), 1.0)


def downsample_rate(gemm: Gemm, gpu: GPUSpec, align: int | None) -> float:
    """The measured rate of a patch convolution whose channels per group meet the alignment
    `align` (a downsampling layer), at the measured side nearest its own; 1: unmeasured, or not
    such a convolution."""
    cin = dict(gemm.align_dims).get("Cin/groups", 0)
    if gemm.family != "conv" or not gemm.patch or not align or cin < align or cin % align:
        return 1.0
    measured = gpu.achievable.memory_efficiency
    key = nearest_size(DOWNSAMPLE_CONV, measured, gemm.patch, gemm.patch)
    return measured.get(key, 1.0)


def gemm_efficiency(
    gemm: Gemm, gpu: GPUSpec, dtype: str, tensor_cores: bool = True
) -> GemmEfficiency:
    """The efficiency model above for one GEMM on `gpu` with math in `dtype` ("bf16", "tf32"...)."""
    sms = gpu.sm_count
    if gemm.m <= 0 or gemm.n <= 0 or gemm.k <= 0:
        return GemmEfficiency(
            gemm=gemm,
            sm_count=sms,
            tile=(0, 0),
            ctas=0,
            split_k=1,
            waves=0,
            tile_eff=1.0,
            wave_eff=1.0,
            alignment=1.0,
            misaligned=(),
            efficiency=1.0,
        )
    tile, tile_eff, wave_eff, ctas, split, waves = _best_tile(gemm, sms)
    reference = _reference(sms, _large_tiles(gemm, sms))
    quantization = min(1.0, tile_eff * wave_eff / reference)
    align = gpu.tc_alignment(dtype) if tensor_cores else None
    penalty, misaligned = 1.0, []
    if align and gemm.family != "attention":
        for name, value in gemm.align_dims:
            small = small_cin_rate(gemm, gpu) if name == "Cin/groups" else 0.0
            p = alignment_penalty(value, align, gemm.family, small)
            if p < 1.0:
                misaligned.append(f"{name}={value}")
                penalty = min(penalty, p)
    rate = downsample_rate(gemm, gpu, align)
    if gemm.rate_key:  # a kernel of its own, measured (unmeasured: the model's rate)
        rate = measured_rate(gemm.rate_key, gpu)
    kernel = gemm.attention
    if kernel is not None and kernel.backend:
        rate = gpu.achievable.attention_rate(
            kernel.backend,
            kernel.backward,
            kernel.dropout,
            kernel.causal,
            gemm.k,
            kernel.gqa,
            seq=gemm.m,  # the rows a CTA tiles: the query length forward, the keys' backward
        )
    return GemmEfficiency(
        gemm=gemm,
        sm_count=sms,
        tile=tile,
        ctas=ctas,
        split_k=split,
        waves=waves,
        tile_eff=tile_eff,
        wave_eff=wave_eff,
        alignment=penalty,
        misaligned=tuple(misaligned),
        efficiency=quantization * penalty * rate,
        kernel_rate=rate,
    )
