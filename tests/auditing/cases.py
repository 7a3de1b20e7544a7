"""For every rule: a model where it must fire (and where) and a twin where it must not.

`CASES[rule_id]` is a `Case`; tests/auditing/test_rules.py runs both sides for every rule in the
registry, so a rule added without a case here fails the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from _chips import H100_DATASHEET
from gpushape.auditing.context import BackendFlags

from .models import (
    GRNMLP,
    Attention,
    ConvBN,
    GeluMLP,
    GroupNormConv,
    ManyTiny,
    MLPStack,
    NormThen,
    OneLinear,
    SoftmaxThen,
    Stem,
    TinyForMaskedLM,
    hf_bert,
    hf_gpt2,
)

BF16 = torch.bfloat16


def meta(*shape: int, dtype: torch.dtype = BF16, channels_last: bool = False) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device="meta")
    return t.to(memory_format=torch.channels_last) if channels_last else t


def scores() -> torch.Tensor:
    """Attention scores (B, H, T, T) that need a gradient (the model has no parameters)."""
    return meta(64, 12, 512, 512).requires_grad_()


def build(cls: type, *args: Any, dtype: torch.dtype = BF16, **kwargs: Any) -> torch.nn.Module:
    """`cls(*args, **kwargs)` made on the meta device (no memory, no init), in `dtype`."""
    with torch.device("meta"):
        return cls(*args, **kwargs).to(dtype)


@dataclass(frozen=True)
class Side:
    model: Callable[[], torch.nn.Module]
    inputs: Callable[[], Any]
    kwargs: dict = field(default_factory=dict)  # extra audit() arguments

    def build(self) -> tuple[torch.nn.Module, Any, dict]:
        kwargs = {"gpu": H100_DATASHEET, **self.kwargs}  # textbook cases: datasheet numbers
        kwargs = {
            k: v() if callable(v) and k in ("optimizer", "dataloader") else v
            for k, v in kwargs.items()
        }
        return self.model(), self.inputs(), kwargs


@dataclass(frozen=True)
class Case:
    fires: Side
    twin: Side
    module: str  # where the finding must point
    saving: str = "time"  # "time": est_saving_s > 0; "memory": bytes in evidence; "none"


def _loader(**options: Any) -> DataLoader:
    data = TensorDataset(torch.zeros(16, 4))
    return DataLoader(data, batch_size=4, **options)


def _adamw(**options: Any) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(256, 256)) for _ in range(8)]
    return torch.optim.AdamW(params, **options)


def _cl(model: torch.nn.Module) -> torch.nn.Module:
    return model.to(memory_format=torch.channels_last)


def _s2d(model: torch.nn.Module) -> torch.nn.Module:
    from gpushape.models.space_to_depth import SpaceToDepthConv2d

    model.conv = SpaceToDepthConv2d(model.conv)
    return model


def _with_s2d_rate(rate: float = 0.15, fold: float = 0.21):
    """The H200's profile with rates for s2d-stem's convolution and fold (none is shipped yet;
    these are about an H100's)."""
    import dataclasses

    from gpushape.hardware.profile import calibrated

    gpu = calibrated("h200")
    measured = {**gpu.achievable.memory_efficiency, "s2d_stem": rate, "s2d_fold": fold}
    return gpu.replace(achievable=dataclasses.replace(gpu.achievable, memory_efficiency=measured))


TOKENS = (8, 512, 768)
CASES: dict[str, Case] = {
    # K = 4095 in bf16 on an H100: the GEMM cliff; K = 4096 is aligned.
    "tc-align": Case(
        fires=Side(lambda: build(OneLinear, 4095, 4096), lambda: (meta(8192, 4095),)),
        twin=Side(lambda: build(OneLinear, 4096, 4096), lambda: (meta(8192, 4096),)),
        module="fc",
    ),
    "nchw-conv": Case(
        fires=Side(lambda: build(ConvBN), lambda: (meta(32, 64, 56, 56),)),
        twin=Side(lambda: _cl(build(ConvBN)), lambda: (meta(32, 64, 56, 56, channels_last=True),)),
        module="conv",
    ),
    # fp32 with PyTorch's default flags (no TF32 for matmuls) against TF32 allowed.
    "fp32-math": Case(
        fires=Side(
            lambda: OneLinear(1024, 1024),
            lambda: (meta(4096, 1024),),
            {"dtype": torch.float32, "flags": BackendFlags(matmul_tf32=False)},
        ),
        twin=Side(
            lambda: OneLinear(1024, 1024),
            lambda: (meta(4096, 1024),),
            {"dtype": torch.float32, "flags": BackendFlags(matmul_tf32=True)},
        ),
        module="fc",
    ),
    "unfused-norm-act": Case(
        fires=Side(lambda: build(NormThen, act_after_norm=True), lambda: (meta(8, 512, 1024),)),
        twin=Side(lambda: build(NormThen, act_after_norm=False), lambda: (meta(8, 512, 1024),)),
        module="norm",
    ),
    # ConvNeXt-V2's MLP with PyTorch's GRN against the same with gpushape's kernels
    "unfused-grn": Case(
        fires=Side(lambda: build(GRNMLP), lambda: (meta(64, 56, 56, 96),)),
        twin=Side(lambda: build(GRNMLP, fused=True), lambda: (meta(64, 56, 56, 96),)),
        module="grn",
    ),
    # a conv, GroupNorm and ReLU on PyTorch's kernels against gpushape's GroupNormAct
    "slow-group-norm": Case(
        fires=Side(lambda: build(GroupNormConv), lambda: (meta(64, 256, 56, 56),)),
        twin=Side(lambda: build(GroupNormConv, fused=True), lambda: (meta(64, 256, 56, 56),)),
        module="norm",
    ),
    # torch's max pool against gpushape's kernel in the same stem
    "slow-max-pool": Case(
        fires=Side(lambda: _cl(build(Stem)), lambda: (meta(64, 3, 224, 224, channels_last=True),)),
        twin=Side(
            lambda: _cl(build(Stem, fast_pool=True)),
            lambda: (meta(64, 3, 224, 224, channels_last=True),),
        ),
        module="pool",
    ),
    # ResNet's stem: cuDNN's padded path, against the same stem already folded by s2d-stem
    "slow-stem": Case(
        fires=Side(
            lambda: _cl(build(Stem, fast_pool=True)),
            lambda: (meta(64, 3, 224, 224, channels_last=True),),
            {"gpu": _with_s2d_rate()},
        ),
        twin=Side(
            lambda: _cl(_s2d(build(Stem, fast_pool=True))),
            lambda: (meta(64, 3, 224, 224, channels_last=True),),
            {"gpu": _with_s2d_rate()},
        ),
        module="conv",
    ),
    "bn-no-running-stats": Case(
        fires=Side(
            lambda: _cl(build(ConvBN, running_stats=False)),
            lambda: (meta(32, 64, 56, 56, channels_last=True),),
        ),
        twin=Side(lambda: _cl(build(ConvBN)), lambda: (meta(32, 64, 56, 56, channels_last=True),)),
        module="bn",
    ),
    "conv-bias-before-bn": Case(
        fires=Side(
            lambda: _cl(build(ConvBN, bias=True)),
            lambda: (meta(32, 64, 56, 56, channels_last=True),),
        ),
        twin=Side(lambda: _cl(build(ConvBN)), lambda: (meta(32, 64, 56, 56, channels_last=True),)),
        module="conv",
    ),
    "separate-qkv": Case(
        fires=Side(lambda: build(Attention, fused_qkv=False), lambda: (meta(*TOKENS),)),
        twin=Side(lambda: build(Attention), lambda: (meta(*TOKENS),)),
        module="",
    ),
    "manual-attention": Case(
        fires=Side(lambda: build(Attention, manual=True), lambda: (meta(*TOKENS),)),
        twin=Side(lambda: build(Attention), lambda: (meta(*TOKENS),)),
        module="",
    ),
    # With a mask SDPA needs the memory-efficient kernel: head size a multiple of 8 (bf16).
    "attention-head-dim": Case(
        fires=Side(lambda: build(Attention, head_dim=36, mask=True), lambda: (meta(*TOKENS),)),
        twin=Side(lambda: build(Attention, head_dim=32, mask=True), lambda: (meta(*TOKENS),)),
        module="",
    ),
    "unfused-softmax-dropout": Case(
        fires=Side(lambda: SoftmaxThen(0.1), lambda: (scores(),)),
        twin=Side(lambda: SoftmaxThen(0.0), lambda: (scores(),)),
        module="",
    ),
    "unfused-activation": Case(
        fires=Side(lambda: build(GeluMLP), lambda: (meta(8192, 1024),)),
        twin=Side(lambda: build(GeluMLP, written=False), lambda: (meta(8192, 1024),)),
        module="act",
    ),
    # The same model in inference: no loss, every position's logits are wanted.
    "dense-mlm-head": Case(
        fires=Side(lambda: build(TinyForMaskedLM), lambda: (meta(32, 512, dtype=torch.int64),)),
        twin=Side(
            lambda: build(TinyForMaskedLM),
            lambda: (meta(32, 512, dtype=torch.int64),),
            {"train": False},
        ),
        module="cls",
    ),
    # Compiled, where transformers up to 5.17 builds an all-true mask (tests/_hf_masks.py
    # makes a later release do so too); the twin has skip-attention-mask's implementation.
    "materialized-attention-mask": Case(
        fires=Side(
            lambda: hf_bert().to(BF16),
            lambda: (meta(8, 512, dtype=torch.int64),),
            {"mode": "compile"},
        ),
        twin=Side(
            lambda: hf_bert("gpushape_sdpa").to(BF16),
            lambda: (meta(8, 512, dtype=torch.int64),),
            {"mode": "compile"},
        ),
        module="encoder.layer.*.attention.self",
    ),
    # A decoder trains with transformers' default use_cache=True; the twin without the cache.
    "kv-cache-in-training": Case(
        fires=Side(lambda: hf_gpt2().to(BF16), lambda: (meta(8, 1024, dtype=torch.int64),)),
        twin=Side(
            lambda: hf_gpt2(use_cache=False).to(BF16), lambda: (meta(8, 1024, dtype=torch.int64),)
        ),
        module="transformer.h.*.attn",
    ),
    "launch-bound": Case(
        fires=Side(lambda: build(ManyTiny), lambda: (meta(16, 64),)),
        twin=Side(lambda: build(OneLinear, 8192, 8192), lambda: (meta(8192, 8192),)),
        module="",
    ),
    # 2432 x 1856 x 504: no tile or split-K of the library fills the 132 SMs of an H100
    # (best: 84 %), and cuBLAS's 256x128 tiles run it in two waves, the second 14 % full;
    # 8192 x 1024 x 512 fills them.
    "wave-quantization": Case(
        fires=Side(
            lambda: build(OneLinear, 504, 1856), lambda: (meta(2432, 504),), {"train": False}
        ),
        twin=Side(
            lambda: build(OneLinear, 512, 1024), lambda: (meta(8192, 512),), {"train": False}
        ),
        module="fc",
    ),
    # 16 blocks of 4096 wide at 256k tokens keep ~100 GB for backward: more than an H100 has.
    "checkpoint-candidate": Case(
        fires=Side(lambda: build(MLPStack), lambda: (meta(262144, 4096),)),
        twin=Side(lambda: build(MLPStack), lambda: (meta(1024, 4096),)),
        module="blocks.*",
        saving="memory",
    ),
    "optimizer-not-fused": Case(
        fires=Side(
            lambda: build(OneLinear, 256, 256),
            lambda: (meta(64, 256),),
            {"optimizer": lambda: _adamw(foreach=False)},
        ),
        twin=Side(
            lambda: build(OneLinear, 256, 256),
            lambda: (meta(64, 256),),
            {"optimizer": lambda: _adamw(fused=True)},
        ),
        module="",
    ),
    "dataloader": Case(
        fires=Side(
            lambda: build(OneLinear, 256, 256),
            lambda: (meta(64, 256),),
            {"dataloader": lambda: _loader(num_workers=0)},
        ),
        twin=Side(
            lambda: build(OneLinear, 256, 256),
            lambda: (meta(64, 256),),
            {
                "dataloader": lambda: _loader(
                    num_workers=2, pin_memory=True, persistent_workers=True
                )
            },
        ),
        module="",
        saving="none",
    ),
}
