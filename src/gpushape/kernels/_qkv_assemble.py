"""FusedQKV's backward glue: dq, dk, dv (B, heads, T, D) written into one (B, T, R) gradient of
the fused GEMM's output (R = (H + 2 Hkv) D), which the GEMM's backward reads as one matrix.

Autograd would do this with `cat` over the split's transposed views; on the H200 that cat ran
at about 1 TB/s (99 us for LLaMA-7B's 100 MB, the GEMMs around it ~260 us each). Here each
head's (T, D) block is copied tile by tile: rows of D contiguous elements on both sides, so
every load and store is coalesced. One launch covers the three gradients (a program picks its
source by head); each is read once and the output written once.

CUDA tensors (and CPU ones under TRITON_INTERPRET=1) run the Triton kernel; other tensors, a
missing gradient (zeros), and gradients whose last dimension is not contiguous take `copy_` into
the output's slices.
"""

from __future__ import annotations

import functools

import torch

from ._dispatch import use_triton
from ._launch import Launch, aligned

_TILE_ELEMENTS = 4096  # elements a program copies (8 KB of bf16)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _assemble_heads_kernel(q, k, v, dst, T, H0, H1, HEADS, R, D,
                               qb, qh, qt, kb, kh, kt, vb, vh, vt,
                               BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
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


_PLANS: dict[tuple, Launch] = {}


def _launch(args: tuple, batch: int, t: int, heads: int, d: int) -> None:
    """One launch for these integer arguments. The key holds every integer argument: Triton
    specialises a compiled kernel on their values (1, multiples of 16), and `Launch` reuses the
    compiled kernel without asking again."""
    tensors, ints = args[:4], args[4:]
    dst = tensors[-1]
    key = (*ints, dst.dtype, dst.device)
    plan = _PLANS.get(key)
    if plan is None:
        import triton

        block_d = triton.next_power_of_2(d)
        block_t = max(1, min(_TILE_ELEMENTS // block_d, triton.next_power_of_2(t)))
        plan = _PLANS[key] = Launch(_kernel(), (triton.cdiv(t, block_t), batch * heads),
                                    dict(BLOCK_T=block_t, BLOCK_D=block_d, num_warps=4))
    plan(aligned(*tensors), *args)


def assemble_heads(grads: tuple[torch.Tensor | None, ...], heads: tuple[int, ...],
                   shape: tuple[int, int, int], dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """The (B, T, R) gradient of the GEMM output from the gradients (B, h_i, T, D) of q, k and v
    in head order; a None part (an output that got no gradient) contributes zeros."""
    batch, t, r = shape
    d = r // sum(heads)
    out = torch.empty((batch, t, r), dtype=dtype, device=device)
    if not out.numel():
        return out
    if use_triton(out) and all(g is not None and g.stride(-1) == 1 and g.dtype == dtype
                               for g in grads):
        strides = [s for g in grads for s in g.stride()[:3]]
        _launch((*grads, out, t, heads[0], heads[1], sum(heads), r, d, *strides),
                batch, t, sum(heads), d)
        return out
    view = out.view(batch, t, sum(heads), d)
    head0 = 0
    for g, h in zip(grads, heads):
        part = view[:, :, head0:head0 + h]
        if g is None:
            part.zero_()
        else:
            part.copy_(g.transpose(1, 2))
        head0 += h
    return out
