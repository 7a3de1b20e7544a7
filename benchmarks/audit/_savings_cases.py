"""The textbook cases of validate_savings.py: for each rule, a model as written and the same
model fixed (`Case.build(device, scale) -> (as is, fixed)`), bf16 unless the rule is about the
dtype. A new rule adds its case to CASES here (docs/contributing.md)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this working tree's gpushape, installed or not

from gpushape.auditing.context import BackendFlags  # noqa: E402
from gpushape.models import create_model  # noqa: E402

BF16 = torch.bfloat16


@dataclass
class Variant:
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    check: Callable[[torch.Tensor], torch.Tensor] = lambda y: y  # maps output to compare


@dataclass
class Case:
    rule: str
    build: Callable[[str, int], tuple[Variant, Variant]]  # (device, scale) -> (as is, fixed)
    flags: BackendFlags | None = None
    atol: float = 3e-2  # outputs compared relative to the original's largest magnitude
    cuda_only: bool = False
    check_train: bool = False  # compare in train mode (BatchNorm's batch statistics)
    label: str = ""  # a second case of one rule: "rule (what)"

    @property
    def name(self) -> str:
        return f"{self.rule} ({self.label})" if self.label else self.rule


def _div(n: int, scale: int) -> int:
    return max(1, n // scale)


def _x(*shape, device, dtype=BF16, grad=True, channels_last=False):
    t = torch.randn(*shape, device=device, dtype=dtype)
    if channels_last:
        t = t.to(memory_format=torch.channels_last)
    return t.requires_grad_(grad)


def head(device, s):  # tc-align: BERT's vocabulary 30522 against 30528
    k, n, m = 768, 30522, _div(4096, s)
    a = nn.Linear(k, n).to(device, BF16)
    b = nn.Linear(k, n + 6).to(device, BF16)
    with torch.no_grad():
        b.weight.zero_(), b.bias.zero_()
        b.weight[:n].copy_(a.weight), b.bias[:n].copy_(a.bias)
    x = _x(m, k, device=device)
    return Variant(a, (x,)), Variant(b, (x,), lambda y: y[:, :n])


class Projections(nn.Module):
    def __init__(self, width: int, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(width, 3 * width) if fused else None
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        if self.fused:
            return self.qkv(x)
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)


def qkv(device, s):  # separate-qkv, one BERT-base layer's projections
    a = Projections(768, fused=False).to(device, BF16)
    b = Projections(768, fused=True).to(device, BF16)
    with torch.no_grad():
        b.qkv.weight.copy_(torch.cat([a.query.weight, a.key.weight, a.value.weight]))
        b.qkv.bias.copy_(torch.cat([a.query.bias, a.key.bias, a.value.bias]))
    x = _x(_div(8, s), _div(512, s), 768, device=device)
    return Variant(a, (x,)), Variant(b, (x,))


def bert(device, s):  # manual-attention (and unfused-softmax-dropout) in BERT-base
    a, (ids,) = create_model(
        "bert-base", batch=_div(8, s), seq_len=_div(512, s), attention="manual", device=device
    )
    b, _ = create_model("bert-base", batch=_div(8, s), seq_len=_div(512, s), device=device)
    b.load_state_dict(a.state_dict())
    return Variant(a, (ids,)), Variant(b, (ids,))


class SoftmaxThen(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(torch.softmax(x, dim=-1))


def softmax_dropout(device, s):
    from gpushape.kernels import SoftmaxDropout

    x = _x(_div(32, s), 12, _div(512, s), _div(512, s), device=device)
    return Variant(SoftmaxThen(0.1), (x,)), Variant(SoftmaxDropout(0.1), (x,))


class NormGELU(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.norm(x))


def norm_act(device, s):
    from gpushape.kernels import LayerNormGELU

    a = NormGELU(4096).to(device, BF16)
    b = LayerNormGELU(4096).to(device, BF16)
    b.load_state_dict(a.norm.state_dict())
    x = _x(_div(16384, s), 4096, device=device)
    return Variant(a, (x,)), Variant(b, (x,))


class BatchNormAddReLU(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x, residual):
        return F.relu(self.bn(x) + residual)


def batch_norm_act(device, s):  # unfused-norm-act on ResNet-50's 56x56 stage
    from gpushape.kernels import BatchNormAct2d

    a = BatchNormAddReLU(256).to(device, BF16)
    b = BatchNormAct2d.from_batchnorm(copy.deepcopy(a.bn))
    x, r = (_x(_div(64, s), 256, 56, 56, device=device, channels_last=True) for _ in range(2))
    return Variant(a, (x, r)), Variant(b, (x, r))


def resnet(device, s):  # nchw-conv
    a, (x,) = create_model("resnet50", batch=_div(64, s), device=device)
    b, _ = create_model("resnet50", batch=_div(64, s), device=device)
    b.load_state_dict(a.state_dict())
    b = b.to(memory_format=torch.channels_last)
    return Variant(a, (x,)), Variant(b, (x.to(memory_format=torch.channels_last),))


class ConvBN(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(64)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def conv_bias(device, s):  # conv-bias-before-bn: BatchNorm cancels the bias exactly
    a = ConvBN(bias=True).to(device, BF16).to(memory_format=torch.channels_last)
    b = ConvBN(bias=False).to(device, BF16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        b.conv.weight.copy_(a.conv.weight)
    x = _x(_div(64, s), 64, 56, 56, device=device, channels_last=True)
    return Variant(a, (x,)), Variant(b, (x,))


class Autocast(nn.Module):
    def __init__(self, inner: nn.Module, device: str) -> None:
        super().__init__()
        self.inner, self.device = inner, device

    def forward(self, x):
        with torch.autocast(self.device, dtype=BF16):
            return self.inner(x)


def fp32(device, s):  # fp32-math: fp32 without TF32 against autocast bf16
    a = nn.Linear(4096, 4096).to(device)
    x = _x(_div(8192, s), 4096, device=device, dtype=torch.float32)
    return Variant(a, (x,)), Variant(Autocast(a, device), (x,), lambda y: y.float())


class ManyTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(40))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def tiny(device, s):  # launch-bound: eager against a CUDA graph of forward and backward
    a = ManyTiny().to(device, BF16)
    x = _x(16, 64, device=device)
    b = torch.cuda.make_graphed_callables(copy.deepcopy(a), (x,))  # replaces its forward
    return Variant(a, (x,)), Variant(b, (x,))


CASES = {
    c.name: c
    for c in (
        Case("tc-align", head),
        Case("separate-qkv", qkv),
        Case("manual-attention", bert),
        Case("unfused-softmax-dropout", softmax_dropout),
        Case("unfused-norm-act", norm_act),
        Case("unfused-norm-act", batch_norm_act, check_train=True, label="BN"),
        Case("nchw-conv", resnet),
        Case("conv-bias-before-bn", conv_bias, check_train=True),
        Case("fp32-math", fp32, BackendFlags(matmul_tf32=False, cudnn_tf32=False), atol=0.1),
        Case("launch-bound", tiny, cuda_only=True, check_train=True),
    )
}
