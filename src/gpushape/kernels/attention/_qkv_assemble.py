"""FusedQKV's backward glue: dq, dk, dv (B, heads, T, D) written into one (B, T, R) gradient of
the fused GEMM's output (R = (H + 2 Hkv) D), which the GEMM's backward reads as one matrix.

Autograd would do this with `cat` over the split's transposed views. For gradients contiguous in
(B, heads, T, D), which a written-out attention's matmul backward gives, that cat ran at about
1 TB/s on the H200 (99 us for LLaMA-7B's 100 MB, the GEMMs around it ~260 us each); for the
(B, T, heads, D) memory SDPA's backward gives, it ran as fast as this kernel. Here each
head's (T, D) block is copied tile by tile: rows of D contiguous elements on both sides, so
every load and store is coalesced. One launch covers the three gradients (a program picks its
source by head); each is read once and the output written once.

CUDA tensors (and CPU ones under TRITON_INTERPRET=1) run the Triton kernel; other tensors, a
missing gradient (zeros), and gradients whose last dimension is not contiguous take `copy_` into
the output's slices.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .._dispatch import use_triton
from .._launch import Launch, aligned
from .._plan_cache import PlanCache

_TILE_ELEMENTS = 4096  # elements a program copies (8 KB of bf16)
_MAX_GRID_Y = 65535  # CUDA's limit on the grid's second dimension (batch x heads here)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _assemble_heads_kernel(
        q,
        k,
        v,
        dst,
        T,
        H0,
        H1,
        HEADS,
        R,
        D,
        qb,
        qh,
        qt,
        kb,
        kh,
        kt,
        vb,
        vh,
        vt,
        BLOCK_T: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        """dst[b, t, j * D + d] = part[b, h, t, d] for one (b, head j) and BLOCK_T rows, where
        head j is q's head j, k's head j - H0 or v's head j - H0 - H1."""
        pid_t = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = (pid_bh // HEADS).to(tl.int64)
        j = (pid_bh % HEADS).to(tl.int64)
        if j < H0:
            src, h, s_b, s_h, s_t = q, j, qb, qh, qt
        elif j < H0 + H1:
            src, h, s_b, s_h, s_t = k, j - H0, kb, kh, kt
        else:
            src, h, s_b, s_h, s_t = v, j - H0 - H1, vb, vh, vt
        t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        d = tl.arange(0, BLOCK_D)
        mask = (t[:, None] < T) & (d[None, :] < D)
        t64 = t.to(tl.int64)
        vals = tl.load(src + b * s_b + h * s_h + t64[:, None] * s_t + d[None, :], mask=mask)
        out = dst + b * T * R + t64[:, None] * R + j * D + d[None, :]
        tl.store(out, vals, mask=mask)

    return _assemble_heads_kernel


_LAUNCHES: dict[tuple, Launch] = {}


def _launch_for(ints: tuple, batch: int, dtype: torch.dtype, device: torch.device) -> Launch:
    """The launch for these integer arguments (t, H0, H1, heads, R, D, 9 strides). The key holds
    every one: Triton specialises a compiled kernel on their values (1, multiples of 16), and
    `Launch` reuses the compiled kernel without asking again."""
    key = (*ints, batch, dtype, device)
    launch = _LAUNCHES.get(key)
    if launch is None:
        import triton

        t, heads, d = ints[0], ints[3], ints[5]
        block_d = triton.next_power_of_2(d)
        block_t = max(1, min(_TILE_ELEMENTS // block_d, triton.next_power_of_2(t)))
        launch = _LAUNCHES[key] = Launch(
            _kernel(),
            (triton.cdiv(t, block_t), batch * heads),
            dict(BLOCK_T=block_t, BLOCK_D=block_d, num_warps=4),
        )
    return launch


def _ints(t: int, heads: tuple[int, ...], d: int, strides: list[int]) -> tuple:
    return (t, heads[0], heads[1], sum(heads), sum(heads) * d, d, *strides)


class AssemblyPlan(NamedTuple):
    """What the backward needs when dq, dk, dv arrive contiguous in (B, h, T, D), the common
    case, built once per shape in the forward: the launch, its integer arguments, and the
    strides that case has (checked against the gradients that come)."""

    launch: Launch
    ints: tuple
    strides: tuple[tuple[int, ...], ...]


_PLANS: PlanCache[AssemblyPlan] = PlanCache(None)  # unbounded, as before: one per shape


def assembly_plan(
    shape: tuple[int, int, int], heads: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> AssemblyPlan | None:
    """The plan for contiguous gradients of this shape; None when batch x heads programs do
    not fit the grid (the backward then copies with torch)."""
    if shape[0] * sum(heads) > _MAX_GRID_Y:
        return None
    return _PLANS.get((shape, heads, dtype, device), _build_plan, shape, heads, dtype, device)


def _build_plan(shape, heads, dtype, device) -> AssemblyPlan:
    batch, t, r = shape
    d = r // sum(heads)
    strides = tuple((h * t * d, t * d, d, 1) for h in heads)
    ints = _ints(t, heads, d, [s for st in strides for s in st[:3]])
    return AssemblyPlan(_launch_for(ints, batch, dtype, device), ints, strides)


def assemble_heads(
    grads: tuple[torch.Tensor | None, ...],
    heads: tuple[int, ...],
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    plan: AssemblyPlan | None = None,
) -> torch.Tensor:
    """The (B, T, R) gradient of the GEMM output from the gradients (B, h_i, T, D) of q, k and v
    in head order; a None part (an output that got no gradient) contributes zeros. `plan`
    (from the forward) skips the checks when the gradients come contiguous."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if (
        plan is not None
        and all(g is not None and g.dtype is dtype for g in grads)
        and tuple(g.stride() for g in grads) == plan.strides
    ):
        plan.launch(aligned(*grads, out), *grads, out, *plan.ints)
        return out
    batch, t, r = shape
    d = r // sum(heads)
    if not out.numel():
        return out
    if (
        use_triton(out)
        and batch * sum(heads) <= _MAX_GRID_Y
        and all(g is not None and g.stride(-1) == 1 and g.dtype == dtype for g in grads)
    ):
        ints = _ints(t, heads, d, [s for g in grads for s in g.stride()[:3]])
        _launch_for(ints, batch, dtype, device)(aligned(*grads, out), *grads, out, *ints)
        return out
    view = out.view(batch, t, sum(heads), d)
    head0 = 0
    for g, h in zip(grads, heads):
        part = view[:, :, head0 : head0 + h]
        if g is None:
            part.zero_()
        else:
            part.copy_(g.transpose(1, 2))
        head0 += h
    return out
