"""Fused attention kernels' rate against the GEMM model's, by backend, pass, head size, dropout
and causal masking.

The GEMM model prices an attention kernel's matmuls at the large-GEMM rate, scaled by how its
(batch x head, 128-row block) programs fill the GPU. Real flash and memory-efficient kernels do
more than matmuls (online softmax, rescaling, the backward's recomputation, Philox for dropout)
and at head size 64 their tiles are thin, so they run well below that. For each configuration
in CONFIGS, one SDPA call (bf16, B x H x T x D) is timed forward, and forward + backward, from a
CUDA graph, and the same call is traced by gpushape to get the model's time per pass:

    efficiency = model compute time (this module's factor left at 1)
                 / (measured time - the model's time for the kernels beside the main one)

per pass, capped to [0.01, 1]. The factor scales the GEMM model's compute side alone
(tracing/gemm_model.py), so it is taken against that side: an attention call over short
sequences (ViT-B/16's 197 tokens at head size 64) has a larger memory time than compute time
in the model at factor 1, and a factor taken against that memory time priced the call below
its measured time (33 us against 46.5 forward on the H200). A fused backward also runs
memory-bound kernels beside its main one (dO . O row sums, dQ's float32 zeroing and
conversion), which the cost model prices apart (`tracing.flops.attention.backward_passes`, the
"attention_pass" family): the timed call less their modelled time is what the main kernel's
rate is taken against. The profile keeps the
rates under "attention"; the GEMM model multiplies an attention kernel's efficiency by the one
measured for its backend, pass, dropout and causal flags at the nearest head size
(`Achievable.attention_rate`).

"flash" and "efficient" force that backend. "default" leaves the choice to PyTorch, as a model
calling SDPA does: on the H200 with torch 2.11 a call the flash kernel could take ran cuDNN's
kernel instead (GPT-2, BERT, ViT-B/16 and a LLaMA-style decoder under torch.compile all showed
`cudnn_generated_fort_native_sdpa_sm90_flash_*`), whose causal kernel ran about twice as fast
as the forced flash kernel's. The trace names such a call flash (tracing/routing.py), and the
GEMM model takes the "default" rate for it where the profile has one. "gqa" configurations
give K and V a quarter of Q's heads (`enable_gqa`). "cudnn_masked" gives SDPA an all-true
boolean mask as transformers does, (B, 1, T, T) expanded over the heads, and leaves the choice
to PyTorch (cuDNN's kernel over every score on the H200 and the H100, torch 2.11): the rate a
masked call runs at, which the audit prices transformers' materialized mask with
(materialized-attention-mask; the traced call's price is that rule's) and measured nowhere
else (the H200's profile had it fitted from one probe's kernel times; the H100 probe's profile
had none, and priced that fix at nothing where it saved 2.2-3.4 ms). Each row names the kernels
one call ran.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..hardware import GPUSpec
from .memory import capped, step_s

MASKED = "cudnn_masked"  # the cost model's backend for SDPA given a mask (tracing/flops/attention)


@dataclass(frozen=True)
class AttentionConfig:
    # "flash" or "efficient" (torch.nn.attention.SDPBackend names, lower case), "default":
    # whatever SDPA picks by itself, or MASKED: SDPA's own pick given an all-true mask
    backend: str
    head_dim: int
    dropout: float = 0.0
    causal: bool = False
    gqa: bool = False  # K and V with a quarter of Q's heads, enable_gqa=True
    # the sequence length, at the same number of tokens (batch x length) as the probe's shape;
    # 0: the probe's own length (its key carries no "@t")
    seq: int = 0

    def key(self, backward: bool) -> str:
        """The profile's key: "flash/fwd/d64", "efficient/bwd/dropout/d128",
        "default/fwd/d64@t256" (a configuration of its own sequence length)..."""
        return attention_key(
            self.backend, backward, self.dropout > 0, self.causal, self.head_dim, self.gqa
        ) + (f"@t{self.seq}" if self.seq else "")

    def shape(self, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """(batch, heads, length) of this configuration's call, given the probe's."""
        b, h, t = shape
        return (max(b * t // self.seq, 1), h, self.seq) if self.seq else shape

    @property
    def describe(self) -> str:
        if self.backend == MASKED:
            drop = f", dropout {self.dropout}" if self.dropout else ""
            return f"attention given an all-true boolean mask, head size {self.head_dim}{drop}"
        extra = "".join(
            (
                f", dropout {self.dropout}" if self.dropout else "",
                ", causal" if self.causal else "",
                ", grouped-query (4 query heads a K/V head)" if self.gqa else "",
                f", sequences of {self.seq}" if self.seq else "",
            )
        )
        return f"{self.backend} attention, head size {self.head_dim}{extra}"


def attention_key(
    backend: str, backward: bool, dropout: bool, causal: bool, head_dim: int, gqa: bool = False
) -> str:
    return "/".join(
        (
            backend,
            "bwd" if backward else "fwd",
            *(("dropout",) if dropout else ()),
            *(("causal",) if causal else ()),
            *(("gqa",) if gqa else ()),
            f"d{head_dim}",
        )
    )


CONFIGS = (
    AttentionConfig("flash", 64),
    AttentionConfig("flash", 128),
    AttentionConfig("flash", 64, dropout=0.1),
    AttentionConfig("flash", 128, dropout=0.1),
    AttentionConfig("flash", 64, causal=True),
    AttentionConfig("flash", 128, causal=True),
    AttentionConfig("efficient", 64),
    AttentionConfig("efficient", 128),
    AttentionConfig("efficient", 64, dropout=0.1),
    AttentionConfig("default", 64),
    AttentionConfig("default", 128),
    AttentionConfig("default", 64, dropout=0.1),
    AttentionConfig("default", 64, causal=True),
    AttentionConfig("default", 128, causal=True),
    AttentionConfig("default", 64, dropout=0.1, causal=True),
    AttentionConfig("default", 64, causal=True, gqa=True),
    AttentionConfig("default", 128, causal=True, gqa=True),
    AttentionConfig("cudnn_masked", 64),
    AttentionConfig("cudnn_masked", 64, dropout=0.1),
    # short sequences (ViT-B/16's 197 tokens): the same tokens in more, shorter sequences, where
    # each query block's set-up and epilogue weigh more (on a lent H100, ViT-B/16's attention
    # ran at about half the rate measured at 1024)
    AttentionConfig("default", 64, seq=256),
    AttentionConfig("default", 128, seq=256),
    AttentionConfig("default", 64, causal=True, seq=256),
    # windowed attention (Swin's 49-token windows, 32-wide heads, a bias: SDPA's efficient
    # kernel): a CTA per (window, head) doing almost no arithmetic. Priced at the 1024-token
    # head-64 rate, Swin-T's 12 calls came to 1.55 ms of a compiled H200 step that ran them in
    # 2.73 (benchmarks/kernels/probe_window_attention.py times the windows themselves)
    AttentionConfig("efficient", 32),
    AttentionConfig("efficient", 32, seq=64),
)
GQA_GROUP = 4  # query heads a K/V head serves in the "gqa" configurations


class _Attention(nn.Module):
    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        self._mask: torch.Tensor | None = None

    def mask(self, q: torch.Tensor) -> torch.Tensor:
        """The all-true boolean mask of a MASKED call, made once, as transformers gives SDPA
        one: (B, 1, T, T), expanded over the heads."""
        b, h, t = q.shape[0], q.shape[1], q.shape[-2]
        if self._mask is None or self._mask.shape != (b, h, t, t) or self._mask.device != q.device:
            ones = torch.ones(b, 1, t, t, dtype=torch.bool, device=q.device)
            self._mask = ones.expand(b, h, t, t)
        return self._mask

    def forward(self, q, k, v):
        extra = {"enable_gqa": True} if self.cfg.gqa else {}
        if self.cfg.backend == MASKED:
            extra = {"attn_mask": self.mask(q)}
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.cfg.dropout, is_causal=self.cfg.causal, **extra
        )


def _heads(cfg: AttentionConfig, h: int) -> tuple[int, int]:
    """(query heads, K/V heads) of the configuration's call."""
    return h, (max(h // GQA_GROUP, 1) if cfg.gqa else h)


def _costs(spec: GPUSpec, cfg: AttentionConfig, shape: tuple[int, int, int], dtype: torch.dtype):
    """The cost model's OpCost of each SDPA op of one call, forward and backward, with no
    measured attention factor."""
    from ..tracing.cost import op_cost
    from ..tracing.tracer import trace

    flat = spec.replace(achievable=dataclasses.replace(spec.achievable, attention={}))
    b, h, t = shape
    hq, hkv = _heads(cfg, h)
    qkv = tuple(
        torch.empty(b, heads, t, cfg.head_dim, dtype=dtype, device="meta", requires_grad=True)
        for heads in (hq, hkv, hkv)
    )
    ops = trace(_Attention(cfg), qkv, train=True).ops
    return [op_cost(rec, flat) for rec in ops if "scaled_dot_product" in rec.op]


def model_s(
    spec: GPUSpec, cfg: AttentionConfig, shape: tuple[int, int, int], dtype: torch.dtype
) -> tuple[float, float, int, int]:
    """The GEMM model's forward and backward compute time for this call (no measured attention
    factor: what that factor scales), then the FLOPs of each pass."""
    times, flops = {"forward": 0.0, "backward": 0.0}, {"forward": 0, "backward": 0}
    for c in _costs(spec, cfg, shape, dtype):
        times[c.phase] += c.compute_s
        flops[c.phase] += c.flops
    return times["forward"], times["backward"], flops["forward"], flops["backward"]


def passes_s(
    spec: GPUSpec, cfg: AttentionConfig, shape: tuple[int, int, int], dtype: torch.dtype
) -> tuple[float, float]:
    """The cost model's forward and backward time for the memory-bound kernels the call runs
    beside its main ones (a fused backward's row sums and dQ conversion:
    `tracing.flops.attention.backward_passes`), at `spec`'s "attention_pass" rate. A timed
    call includes them; the main kernels' rate is taken without. The memory-efficient kernel
    runs none, and a masked call's rate keeps them (the cost model prices such calls' backward
    with none beside: `tracing/flops/attention.py`): 0 for those."""
    times = {"forward": 0.0, "backward": 0.0}
    if cfg.backend in ("efficient", MASKED):
        return 0.0, 0.0
    for c in _costs(spec, cfg, shape, dtype):
        times[c.phase] += c.passes_s
    return times["forward"], times["backward"]


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def measure_config(
    spec: GPUSpec,
    cfg: AttentionConfig,
    *,
    device: str = "cuda",
    shape: tuple[int, int, int] = (8, 16, 1024),
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 20,
    kernels: bool = True,
) -> dict[str, Any]:
    """One configuration's forward and backward efficiency and what they came from; with
    `kernels`, the names of the kernels it ran (a record only, which the quick probe leaves
    out to stay under its 90 s)."""
    started = time.perf_counter()
    shape = cfg.shape(shape)
    model_fwd, model_bwd, flops_fwd, flops_bwd = model_s(spec, cfg, shape, dtype)
    beside_fwd, beside_bwd = passes_s(spec, cfg, shape, dtype)
    b, h, t = shape
    gen = torch.Generator(device="cpu").manual_seed(0)
    hq, hkv = _heads(cfg, h)
    q, k, v = (
        torch.randn(b, heads, t, cfg.head_dim, generator=gen).to(device, dtype).requires_grad_()
        for heads in (hq, hkv, hkv)
    )
    attn = _Attention(cfg)
    cuda = torch.device(device).type == "cuda"
    if cuda and cfg.backend not in ("default", MASKED):
        from torch.nn.attention import sdpa_kernel

        def forward() -> Any:
            with sdpa_kernel(_backend(cfg.backend)):
                return attn(q, k, v)
    else:  # PyTorch's own choice (on CPU, a smoke test: whatever CPU kernel it picks)

        def forward() -> Any:
            return attn(q, k, v)

    def forward_only() -> Any:
        with torch.no_grad():
            return forward()

    def step() -> Any:
        out = forward()
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    fwd_s = step_s(forward_only, device, repeats)
    both_s = step_s(step, device, repeats)
    bwd_s = max(both_s - fwd_s, 0.0)
    ran = kernels_run(step) if cuda and kernels else []
    return {
        cfg.key(False): capped(model_fwd, fwd_s - beside_fwd),
        cfg.key(True): capped(model_bwd, bwd_s - beside_bwd),
        "workload": f"{cfg.describe}, {b}x{h}x{t}x{cfg.head_dim}",
        "dtype": str(dtype).removeprefix("torch."),
        "measured_fwd_s": fwd_s,
        "measured_bwd_s": bwd_s,
        "model_fwd_s": model_fwd,
        "model_bwd_s": model_bwd,
        "passes_bwd_s": beside_bwd,
        "tflops_fwd": _tflops(flops_fwd, fwd_s),
        "tflops_bwd": _tflops(flops_bwd, bwd_s),
        **({"kernels": ran} if ran else {}),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def kernels_run(fn: Any) -> list[str]:
    """The CUDA kernels one call of `fn` launched, by name (cut at 100 characters), in order;
    [] where the profiler cannot say."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    except (RuntimeError, AttributeError, AssertionError):
        return []
    return list(dict.fromkeys(n[:100] for n in names))


def _tflops(flops: int, seconds: float) -> float:
    return round(flops / seconds / 1e12, 1) if seconds > 0 and math.isfinite(seconds) else 0.0


def measure_attention(
    spec: GPUSpec,
    *,
    device: str = "cuda",
    shape: tuple[int, int, int] = (8, 16, 1024),
    configs: tuple[AttentionConfig, ...] = CONFIGS,
    on_config=None,
    kernels: bool = True,
) -> dict[str, dict[str, Any]]:
    """{workload name: measure_config(...)} for each configuration; one that cannot run (no such
    kernel on this GPU or build) gets {"error": ...} and leaves the model's rate alone."""
    out: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        name = cfg.key(False).replace("/fwd", "")
        if on_config is not None:
            on_config(cfg)
        try:
            out[name] = measure_config(spec, cfg, device=device, shape=shape, kernels=kernels)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            out[name] = {
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "workload": cfg.describe,
            }
    return out


def pass_rates(row: dict[str, Any]) -> tuple[float, float]:
    """(forward, backward) rate of one measured configuration's row."""
    fwd = next(v for k, v in row.items() if "/fwd/" in k)
    bwd = next(v for k, v in row.items() if "/bwd/" in k)
    return fwd, bwd
