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
The data sets and the models: _convergence_models.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

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
