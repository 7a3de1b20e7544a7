"""What `gpushape probe` measures: the sweeps of the quick and the full probe, as data.

Sizes are chosen so that the sweeps see alignment, not wave quantization: a GEMM dimension
moves around 1024 while the other two sit at 16384, and around 4096 while they sit at 8192, so
a step of one size adds a tile row to a grid of 500+ tiles (several waves on any current chip)
instead of tipping a single wave into a second one. Wave quantization gets its own sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .measure import MeasureConfig

# Offsets around each base size: every one of 0..16, then 24, 32, 64, 128, and a few below the
# base so that each power-of-two level (odd, x2, x4, x8, ...) has several points.
FULL_OFFSETS = (-8, -4, -2, -1, *range(17), 24, 32, 64, 128)
QUICK_OFFSETS = (-1, 0, 1, 2, 4, 8, 12, 16, 24, 32, 64)
CHANNEL_OFFSETS = (-4, -2, -1, 0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
QUICK_CHANNEL_OFFSETS = (-1, 0, 1, 2, 4, 8, 16, 32)
WINDOW_OFFSETS = (-8, -4, -2, -1, 0, 1, 2, 4, 8)  # batch sizes around 128 and 256


@dataclass(frozen=True, kw_only=True)
class ConvSweep:
    """Channels of one side of a convolution move around `base`; the other side stays `fixed`."""

    kernel: int
    vary: str  # "cin" or "cout"
    base: int
    fixed: int

    @property
    def name(self) -> str:
        return f"{self.kernel}x{self.kernel} {self.vary}"


@dataclass(frozen=True, kw_only=True)
class ProbePlan:
    mode: str  # "quick", "full" or "tiny" (CPU smoke test)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    # ceilings
    copy_bytes: int = 2**31
    launch_kernels: int = 1000
    memory_scale: float = 1.0  # size of the memory-efficiency workloads (probe/memory.py)
    stem_shape: tuple[int, int] = (64, 224)  # batch, image size of the RGB stem (probe/convs.py)
    # batch, heads, sequence length of the fused-attention calls (probe/attention.py)
    attention_shape: tuple[int, int, int] = (8, 16, 1024)
    peak_dtypes: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
    peak_sizes: tuple[int, ...] = (4096, 8192)
    # GEMM alignment: dims move around each base, the other two dims at other_by_base[base]
    align_dtypes: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
    align_bases: tuple[int, ...] = (1024, 4096)
    other_by_base: tuple[tuple[int, int], ...] = ((1024, 16384), (4096, 8192))
    align_offsets: tuple[int, ...] = FULL_OFFSETS
    align_dims: tuple[str, ...] = ("M", "N", "K")
    linear_dtypes: tuple[str, ...] = ("bf16",)  # also swept in F.linear's layout (x @ W^T)
    # convolutions (channels_last), channels moving around a base
    conv_dtypes: tuple[str, ...] = ("bf16", "fp16")
    conv_sweeps: tuple[ConvSweep, ...] = (
        ConvSweep(kernel=3, vary="cin", base=64, fixed=128),
        ConvSweep(kernel=3, vary="cout", base=64, fixed=128),
        ConvSweep(kernel=1, vary="cin", base=256, fixed=256),
        ConvSweep(kernel=1, vary="cout", base=256, fixed=256),
    )
    conv_offsets: tuple[int, ...] = CHANNEL_OFFSETS
    conv_batch: int = 64
    conv_hw: int = 56
    # batch sweeps: windows of batch sizes (analysed for cliffs) plus context points (plotted)
    batch_windows: tuple[int, ...] = (128, 256)
    gemm_batch_context: tuple[int, ...] = (1, 8, 32, 64, 512, 1024, 2048)
    gemm_batch_nk: int = 4096  # a Linear 4096 -> 4096, bf16: tokens = batch
    conv_batch_context: tuple[int, ...] = (1, 8, 32, 64, 384, 512)
    conv_batch_channels: int = 64  # a ResNet-50 stage-1 3x3 conv, 64 -> 64 at 56x56, bf16
    # wave quantization: bf16 GEMM, M = 128 * i, N = K = wave_nk
    wave_steps: int = 64
    wave_nk: int = 4096
    # the guide's claims
    claims: bool = True

    def gemm_other(self, base: int) -> int:
        return dict(self.other_by_base).get(base, 2 * base)

    def batch_sizes(self, context: tuple[int, ...]) -> tuple[int, ...]:
        window = {b + o for b in self.batch_windows for o in WINDOW_OFFSETS}
        return tuple(sorted(s for s in window | set(context) if s > 0))

    def wave_ms(self) -> tuple[int, ...]:
        return tuple(128 * i for i in range(1, self.wave_steps + 1))


def full_plan() -> ProbePlan:
    return ProbePlan(mode="full")


def quick_plan() -> ProbePlan:
    """Fewer dtypes and points: well under 90 s on an H200, start-up included."""
    return ProbePlan(
        mode="quick",
        measure=MeasureConfig(repeats=5),
        copy_bytes=2**30,
        peak_dtypes=("tf32", "fp16", "bf16", "fp8"),
        peak_sizes=(8192,),
        align_dtypes=("tf32", "bf16"),
        align_bases=(4096,),
        align_offsets=QUICK_OFFSETS,
        linear_dtypes=(),
        conv_dtypes=("bf16",),
        conv_sweeps=(
            ConvSweep(kernel=3, vary="cin", base=64, fixed=128),
            ConvSweep(kernel=3, vary="cout", base=64, fixed=128),
            ConvSweep(kernel=1, vary="cin", base=256, fixed=256),
        ),
        conv_offsets=QUICK_CHANNEL_OFFSETS,
        conv_batch=32,
        batch_windows=(128,),
        gemm_batch_context=(1, 32, 512, 2048),
        conv_batch_context=(32, 256, 512),
        wave_steps=40,
    )


def tiny_plan(device: str = "cpu") -> ProbePlan:
    """Every sweep at toy sizes: runs in seconds on a CPU (the smoke test), proves nothing."""
    return ProbePlan(
        mode="tiny",
        measure=MeasureConfig(device=device, repeats=2, target_s=1e-4, max_inner=4),
        copy_bytes=2**20,
        launch_kernels=50,
        peak_dtypes=("fp32", "bf16"),
        peak_sizes=(32,),
        align_dtypes=("bf16",),
        align_bases=(16,),
        other_by_base=((16, 16),),
        align_offsets=(-1, 0, 1, 2, 4, 8),
        linear_dtypes=("bf16",),
        conv_dtypes=("bf16",),
        conv_sweeps=(ConvSweep(kernel=3, vary="cin", base=8, fixed=8),),
        conv_offsets=(-1, 0, 1, 8),
        conv_batch=2,
        conv_hw=8,
        batch_windows=(8,),
        gemm_batch_context=(1,),
        gemm_batch_nk=16,
        conv_batch_context=(1,),
        conv_batch_channels=8,
        wave_steps=6,
        wave_nk=64,
        memory_scale=0.002,
        stem_shape=(2, 32),
        attention_shape=(1, 2, 16),
    )
