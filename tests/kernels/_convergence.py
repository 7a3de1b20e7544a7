"""Convergence harness: one small model trained twice from the same initial state on the same
data, once with PyTorch's own modules and once with a fused kernel swapped in, and the two
runs compared step by step (loss curves) and at the end (state_dicts: parameters and buffers).

A single forward/backward comparison bounds the error of one call; a few dozen optimizer steps
show whether that error stays put or compounds (a biased gradient, running statistics blended
wrongly, a dropout mask that differs between forward and backward).

Each model builds with `fused=False` (PyTorch) or `fused=True` (gpushape's kernels) and keeps
the same state_dict keys either way (the kernels' modules load PyTorch checkpoints unchanged,
FusedQKV a three-Linear one), so the fused model is loaded from the reference's state_dict with
strict=True: identical initial weights, and the checkpoint compatibility is exercised as well.

CPU tensors, float32 unless a case says otherwise. Under TRITON_INTERPRET=1 the fused model runs
the Triton kernels in the interpreter; without it, the kernels' plain-PyTorch reference path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpushape.kernels import (
    AddLayerNorm,
    BatchNormAct2d,
    FusedQKV,
    LayerNormGELU,
    RMSNorm,
    SoftmaxDropout,
)
from gpushape.kernels.attention.softmax_dropout import draw_seed, dropout_keep_mask

Batch = tuple[Tensor, Tensor]
SEED = 0


@dataclass(frozen=True)
class ConvergenceCase:
    """One kernel's convergence check: build(fused) -> model, the data it learns, the loss."""

    name: str
    build: Callable[[bool], nn.Module]
    data: Callable[[], Sequence[Batch]]  # fixed batches, cycled through in order
    loss: Callable[[Tensor, Tensor], Tensor]  # loss(model(x), target)
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    steps: int = 30
    dtype: torch.dtype = torch.float32  # of the models and the data
    # state_dict entries the kernel owns (its parameters, the running statistics it updates):
    # compared like every entry, and required to have moved in training by far more than the
    # tolerance, so that their agreement at the end means something.
    kernel_state: tuple[str, ...] = ()
    # After training, each model in eval mode is run on this batch (running statistics, no
    # dropout) and the outputs compared; None skips it.
    eval_batch: int | None = 0


@dataclass
class Run:
    losses: list[float]
    state: dict[str, Tensor]
    eval_out: Tensor | None


def build_pair(case: ConvergenceCase) -> tuple[nn.Module, nn.Module]:
    """(reference, fused) models holding identical weights and buffers."""
    torch.manual_seed(SEED)
    ref = case.build(False).to(case.dtype)
    fused = case.build(True).to(case.dtype)
    fused.load_state_dict(ref.state_dict(), strict=True)
    return ref, fused


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Floating targets in the case's dtype; class labels as they are."""
    return t.to(dtype) if t.is_floating_point() else t


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(model: nn.Module, case: ConvergenceCase, batches: Sequence[Batch]) -> Run:
    """case.steps optimizer steps over the batches, cycled; the loss of every step, the
    state_dict at the end, and the model's output in eval mode on case.eval_batch."""
    opt = case.optimizer(list(model.parameters()))
    model.train()
    # Dropout draws its seeds from the global generator: both runs start from the same state
    # and draw one seed per call in the same order, so step t drops the same elements in both.
    torch.manual_seed(SEED + 1)
    losses = []
    for step in range(case.steps):
        x, target = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = case.loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    eval_out = None
    if case.eval_batch is not None:
        model.eval()
        with torch.no_grad():
            eval_out = model(batches[case.eval_batch][0])
    return Run(losses, snapshot(model), eval_out)


def curve_gap(fused: Sequence[float], ref: Sequence[float]) -> tuple[float, int]:
    """(max_t |loss_fused[t] - loss_ref[t]| / loss_ref[0], the step t where it is largest)."""
    gaps = [abs(f - r) / ref[0] for f, r in zip(fused, ref, strict=True)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    return gaps[worst], worst


def tensor_gap(fused: Tensor, ref: Tensor) -> float:
    """max|fused - ref| / max(1, max|ref|): relative for large values, absolute below 1 (the
    scale of _numeric.py's backstop), so entries near zero (a running mean, a bias) are not
    judged relative to their own small size."""
    fused, ref = fused.double(), ref.double()
    return (fused - ref).abs().max().item() / max(1.0, ref.abs().max().item())


def state_gaps(fused: dict[str, Tensor], ref: dict[str, Tensor]) -> dict[str, float]:
    """tensor_gap of every floating state_dict entry; integer entries (num_batches_tracked)
    must be equal."""
    assert fused.keys() == ref.keys(), (sorted(fused), sorted(ref))
    gaps = {}
    for key, r in ref.items():
        f = fused[key]
        assert f.shape == r.shape and f.dtype == r.dtype, (key, f.shape, r.shape, f.dtype)
        if r.is_floating_point():
            gaps[key] = tensor_gap(f, r)
        else:
            assert torch.equal(f, r), (key, f, r)
    return gaps


def fall(losses: Sequence[float], period: int) -> float:
    """Mean loss over the last `period` steps / mean over the first `period` (a pass over the
    batches each): below 1 when the model learns."""
    return sum(losses[-period:]) / sum(losses[:period])


@dataclass
class Comparison:
    ref: Run
    fused: Run
    initial: dict[str, Tensor]  # the state both started from
    period: int  # batches in the data set: steps a pass
    curve_gap: float
    curve_step: int
    state_gaps: dict[str, float]
    eval_gap: float | None

    def moved(self, key: str) -> float:
        """How far the reference's state_dict entry moved in training (tensor_gap units)."""
        return tensor_gap(self.ref.state[key], self.initial[key])

    def summary(self) -> str:
        worst = max(self.state_gaps, key=self.state_gaps.__getitem__)
        return (
            f"loss {self.ref.losses[0]:.4f} -> {self.ref.losses[-1]:.4f} (reference), "
            f"{self.fused.losses[0]:.4f} -> {self.fused.losses[-1]:.4f} (fused); curve gap "
            f"{self.curve_gap:.2e} at step {self.curve_step}; state gap "
            f"{self.state_gaps[worst]:.2e} ({worst}); eval gap {self.eval_gap}"
        )


def compare(case: ConvergenceCase) -> Comparison:
    """Train the reference and the fused model of `case` from one state on one data set.
    Seeds torch's generator; its state is restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        return _compare(case)


def _compare(case: ConvergenceCase) -> Comparison:
    batches = [(x.to(case.dtype), cast(t, case.dtype)) for x, t in case.data()]
    ref, fused = build_pair(case)
    initial = snapshot(ref)
    ref_run, fused_run = train(ref, case, batches), train(fused, case, batches)
    gap, step = curve_gap(fused_run.losses, ref_run.losses)
    eval_gap = None
    if ref_run.eval_out is not None:
        eval_gap = tensor_gap(fused_run.eval_out, ref_run.eval_out)
    return Comparison(
        ref_run,
        fused_run,
        initial,
        len(batches),
        gap,
        step,
        state_gaps(fused_run.state, ref_run.state),
        eval_gap,
    )


# ---- data: fixed synthetic tasks the models can learn ---------------------------------------


def sequence_regression(
    *, d: int = 32, batch: int = 4, seq: int = 16, n_batches: int = 2, mix: bool = False
) -> list[Batch]:
    """(x, target) batches, x (batch, seq, d) ~ N(0, 1), target = a fixed random 2-layer tanh
    network of x; with `mix` its causal running mean over the sequence (a task for attention)."""
    g = torch.Generator().manual_seed(SEED + 2)
    w1 = torch.randn(d, 2 * d, generator=g) / d**0.5
    w2 = torch.randn(2 * d, d, generator=g) / (2 * d) ** 0.5
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, seq, d, generator=g)
        target = torch.tanh(x @ w1) @ w2
        if mix:
            target = target.cumsum(1) / torch.arange(1, seq + 1).view(1, seq, 1)
        out.append((x, target))
    return out


def image_classification(
    *, batch: int = 8, channels: int = 3, size: int = 8, classes: int = 4, n_batches: int = 2
) -> list[Batch]:
    """(x, label) batches, x (batch, channels, size, size); labels from a fixed random linear
    map of the image."""
    g = torch.Generator().manual_seed(SEED + 3)
    w = torch.randn(channels * size * size, classes, generator=g)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, channels, size, size, generator=g)
        out.append((x, (x.flatten(1) @ w).argmax(1)))
    return out


# ---- models: each with the same state_dict keys fused or not --------------------------------


class NormGeluMLP(nn.Module):
    """Two Linear -> LayerNorm -> GELU layers and a Linear head; fused: LayerNormGELU."""

    def __init__(self, fused: bool, d: int = 32, hidden: int = 64, approximate: str = "none"):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, hidden)
        if fused:
            self.norm1 = LayerNormGELU(hidden, approximate=approximate)
            self.norm2 = LayerNormGELU(hidden, approximate=approximate)
            self.act = nn.Identity()
        else:
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.act = nn.GELU(approximate=approximate)
        self.head = nn.Linear(hidden, d)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.norm1(self.fc1(x)))
        h = self.act(self.norm2(self.fc2(h)))
        return self.head(h)


class ResidualNormStack(nn.Module):
    """Post-add LayerNorm blocks: s = mlp(y) + s; y = LayerNorm(s). The first block's fused
    AddLayerNorm has both outputs used (y by the next MLP, s by the next add), so its backward
    takes dy and ds; the last block's s is unused (dy alone)."""

    def __init__(self, fused: bool, d: int = 32, hidden: int = 64, blocks: int = 2):
        super().__init__()
        self.fused = fused
        self.inp = nn.Linear(d, d)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
            for _ in range(blocks)
        )
        norm = AddLayerNorm if fused else nn.LayerNorm
        self.norms = nn.ModuleList(norm(d) for _ in range(blocks))
        self.head = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        s = self.inp(x)
        y = s
        for mlp, norm in zip(self.mlps, self.norms):
            if self.fused:
                y, s = norm(mlp(y), s)
            else:
                s = mlp(y) + s
                y = norm(s)
        return self.head(y)


class RMSNormBlock(nn.Module):
    """A pre-norm residual MLP block and a normed head (LLaMA-style); fused: gpushape's
    RMSNorm, else torch.nn.RMSNorm, both with eps 1e-6."""

    def __init__(self, fused: bool, d: int = 32, hidden: int = 64):
        super().__init__()
        norm = RMSNorm if fused else nn.RMSNorm
        self.inp = nn.Linear(d, d)
        self.norm1, self.norm2 = norm(d, eps=1e-6), norm(d, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, d))
        self.head = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        h = h + self.mlp(self.norm1(h))
        return self.head(self.norm2(h))


class _BatchNormAct(nn.BatchNorm2d):
    """The reference: nn.BatchNorm2d, then + residual, then ReLU or nothing (state_dict of a
    BatchNorm2d)."""

    def __init__(self, num_features: int, activation: str):
        super().__init__(num_features)
        self.activation = activation

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = super().forward(x)
        y = y if residual is None else y + residual
        return torch.relu(y) if self.activation == "relu" else y


class SmallResNet(nn.Module):
    """A stride-2 conv-BN-act stem and a residual conv-BN-add-act, global average pool, a
    linear classifier, in channels_last (the layout convolutions take on tensor cores); fused:
    BatchNormAct2d, the second with its residual input. `activation` is the kernel's: "relu",
    or "none" with a SiLU after each norm (outside the kernel, in both models). 12 channels:
    the ReLU mask's second byte (8 channels a byte) is half used."""

    def __init__(self, fused: bool, activation: str, channels: int = 12, classes: int = 4):
        super().__init__()
        c = channels
        self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        if fused:
            self.bn1, self.bn2 = (BatchNormAct2d(c, activation=activation) for _ in range(2))
        else:
            self.bn1, self.bn2 = (_BatchNormAct(c, activation) for _ in range(2))
        self.act = nn.SiLU() if activation == "none" else nn.Identity()
        self.head = nn.Linear(c, classes)
        self.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.bn1(self.stem(x.contiguous(memory_format=torch.channels_last))))
        h = self.act(self.bn2(self.conv(h), h))
        return self.head(h.mean((2, 3)))


class SoftmaxThenDropout(nn.Module):
    """The reference for SoftmaxDropout: F.softmax, then dropout as torch applies it (kept
    values times 1 / (1 - p)) with the mask the fused op draws: the seed is drawn as the op
    draws it (`draw_seed`, one per call while dropping) and its mask regenerated
    (`dropout_keep_mask`), so after the same torch.manual_seed both drop the same elements."""

    def __init__(self, p: float, scale: float):
        super().__init__()
        self.p, self.scale = p, scale

    def forward(self, x: Tensor, is_causal: bool = False) -> Tensor:
        z = x * self.scale
        if is_causal:
            allowed = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril()
            z = z.masked_fill(~allowed, float("-inf"))
        s = torch.softmax(z, dim=-1)
        if not self.training or self.p == 0:
            return s
        keep = dropout_keep_mask(draw_seed(x.device), x.shape, self.p, x.device)
        return s * keep / (1 - self.p)


class CausalSelfAttention(nn.Module):
    """One causal multi-head attention layer written out (q k^T, softmax-dropout, times v) with
    a residual and a Linear head; fused: SoftmaxDropout."""

    def __init__(self, fused: bool, p: float, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        scale = self.head_dim**-0.5
        self.qkv, self.out, self.head = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn = SoftmaxDropout(p, scale) if fused else SoftmaxThenDropout(p, scale)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = self.attn(q @ k.transpose(-1, -2), is_causal=True)
        o = (a @ v).transpose(1, 2).reshape(b, t, d)
        return self.head(x + self.out(o))


class ThreeLinears(nn.Module):
    """q_proj, k_proj, v_proj as nn.Linear, heads split by view + transpose: (B, heads, T, D)."""

    def __init__(self, d: int, heads: int, kv_heads: int):
        super().__init__()
        self.head_dim = d // heads
        kv = kv_heads * self.head_dim
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, kv), nn.Linear(d, kv)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        return tuple(
            proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )


class GQAttention(nn.Module):
    """Causal grouped-query attention through scaled_dot_product_attention, with a residual and
    a Linear head; fused: FusedQKV, which loads the three Linears' state_dict."""

    def __init__(self, fused: bool, d: int = 32, heads: int = 2, kv_heads: int = 1):
        super().__init__()
        self.qkv = FusedQKV(d, heads, kv_heads) if fused else ThreeLinears(d, heads, kv_heads)
        self.out, self.head = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.head(x + self.out(o.transpose(1, 2).reshape(b, t, d)))
