"""Counter-based dropout decisions (Philox-4x32-10) shared by the attention kernels.

A dropout mask that is never stored has to be regenerated, bit for bit, in the backward pass.
Philox (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11) maps
a 128-bit counter and a 64-bit key to 128 random bits, so element (row, col) of a mask is a pure
function of (seed, row, col) and can be recomputed anywhere.

One Philox call yields four 32-bit words; each word is split into two 16-bit draws, so one call
decides eight neighbouring columns. That keeps the generator's integer work (about 70
instructions per call) well below the memory time of a bf16 softmax. Element (row, col) uses:

    counter = (col // 8, row mod 2^32, row // 2^32, 0),  key = (seed mod 2^32, seed // 2^32)
    draw    = 16-bit half (col % 2) of word (col % 8) // 2
    kept    = draw >= drop_threshold,  drop_threshold = round(p * 65536)

so the drop probability is p rounded to a multiple of 1/65536 (error under 8e-6), and the mask
does not depend on the tensor's strides, the block sizes or the kernel that regenerates it.

This file holds the Triton version (`philox4x32`, `dropout_keep`) and a plain-PyTorch version on
int64 tensors (`philox4x32_reference`, `keep_mask_reference`) that the CPU reference path and the
tests use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Philox-4x32 constants: round multipliers and the Weyl sequence that bumps the key.
MUL_A = 0xD2511F53
MUL_B = 0xCD9E8D57
KEY_BUMP_A = 0x9E3779B9
KEY_BUMP_B = 0xBB67AE85
ROUNDS = 10
DRAW_LEVELS = 1 << 16  # one draw is 16 bits
DRAWS_PER_CALL = 8
MASK32 = 0xFFFFFFFF

# The same numbers as Triton constants (a @triton.jit function may only read constexpr globals).
_MUL_A = tl.constexpr(MUL_A)
_MUL_B = tl.constexpr(MUL_B)
_KEY_BUMP_A = tl.constexpr(KEY_BUMP_A)
_KEY_BUMP_B = tl.constexpr(KEY_BUMP_B)
_ROUNDS = tl.constexpr(ROUNDS)
_MASK32 = tl.constexpr(MASK32)


def drop_threshold(p: float) -> int:
    """Draws below this 16-bit threshold are dropped: P(drop) = threshold / 65536."""
    return round(p * DRAW_LEVELS)


# ---------------------------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------------------------


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Ten Philox-4x32 rounds on uint32 tensors of one shape; returns the four output words."""
    for _ in tl.static_range(_ROUNDS):
        # one 32x32 -> 64-bit multiply gives both halves (IMAD.WIDE.U32 on NVIDIA GPUs)
        prod_a = c0.to(tl.uint64) * _MUL_A
        prod_b = c2.to(tl.uint64) * _MUL_B
        hi_a = (prod_a >> 32).to(tl.uint32)
        hi_b = (prod_b >> 32).to(tl.uint32)
        lo_a = prod_a.to(tl.uint32)
        lo_b = prod_b.to(tl.uint32)
        c0 = hi_b ^ c1 ^ k0
        c1 = lo_b
        c2 = hi_a ^ c3 ^ k1
        c3 = lo_a
        k0 = k0 + _KEY_BUMP_A
        k1 = k1 + _KEY_BUMP_B
    return c0, c1, c2, c3


@triton.jit
def seed_key(seed_ptr):
    """Load the int64 seed (a 1-element device tensor) and split it into the two key words."""
    seed = tl.load(seed_ptr)
    k0 = (seed & _MASK32).to(tl.uint32)
    k1 = ((seed >> 32) & _MASK32).to(tl.uint32)
    return k0, k1


@triton.jit
def dropout_keep(k0, k1, rows, groups, lanes, threshold):
    """Keep decisions for a tile of shape (M, G, 8).

    rows:   (M, 1, 1) int32 row index (so the counter's third word, row // 2^32, is 0)
    groups: (1, G, 1) int32 column group (col // 8)
    lanes:  (1, 1, 8) int32 column within the group (col % 8)
    """
    zero = (rows * 0 + groups * 0).to(tl.uint32)  # (M, G, 1): every counter word gets this shape
    c0 = zero + groups.to(tl.uint32)
    c1 = zero + rows.to(tl.uint32)
    w0, w1, w2, w3 = philox4x32(c0, c1, zero, zero, zero + k0, zero + k1)
    pair = lanes // 2
    word = tl.where(pair == 0, w0, tl.where(pair == 1, w1, tl.where(pair == 2, w2, w3)))
    shift = ((lanes % 2) * 16).to(tl.uint32)
    draw = ((word >> shift) & 0xFFFF).to(tl.int32)
    return draw >= threshold


# ---------------------------------------------------------------------------------------------
# PyTorch (int64 tensors holding uint32 values)
# ---------------------------------------------------------------------------------------------


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for uint32 values, without overflowing int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    t_lo = a_lo * b  # < 2^48
    t_hi = a_hi * b  # < 2^48
    hi = (t_hi + (t_lo >> 16)) >> 16
    lo = (((t_hi & 0xFFFF) << 16) + t_lo) & MASK32
    return hi, lo


def philox4x32_reference(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 on int64 tensors (or ints) holding uint32 values; same words as Triton."""
    for _ in range(ROUNDS):
        hi_a, lo_a = _mulhilo(c0, MUL_A)
        hi_b, lo_b = _mulhilo(c2, MUL_B)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + KEY_BUMP_A) & MASK32
        k1 = (k1 + KEY_BUMP_B) & MASK32
    return c0, c1, c2, c3


def keep_mask_reference(
    seed: int,
    rows: int,
    cols: int,
    p: float,
    device: torch.device | str = "cpu",
    first_row: int = 0,
) -> torch.Tensor:
    """The (rows, cols) bool keep mask the kernels draw for `seed` and drop probability `p`,
    for rows first_row .. first_row + rows - 1."""
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    groups = (cols + DRAWS_PER_CALL - 1) // DRAWS_PER_CALL
    row = torch.arange(first_row, first_row + rows, dtype=torch.int64, device=device)[:, None]
    group = torch.arange(groups, dtype=torch.int64, device=device)[None, :]  # (1, groups)
    zero = torch.zeros(rows, groups, dtype=torch.int64, device=device)
    words = philox4x32_reference(
        zero + group, zero + (row & MASK32), zero + (row >> 32), zero, k0, k1
    )
    halves = [(w >> shift) & 0xFFFF for w in words for shift in (0, 16)]
    draws = torch.stack(halves, dim=-1).reshape(rows, groups * DRAWS_PER_CALL)[:, :cols]
    return draws >= drop_threshold(p)


# ---------------------------------------------------------------------------------------------
# What the ops that draw these masks share (softmax_dropout, norms/dropout_add_layer_norm)
# ---------------------------------------------------------------------------------------------

SEED_HIGH = 2**63 - 1


def draw_seed(device: torch.device | str) -> torch.Tensor:
    """A (1,) int64 seed from torch's generator on `device`: no host sync, CUDA-graph safe."""
    return torch.randint(0, SEED_HIGH, (1,), dtype=torch.int64, device=device)


def dropout_keep_mask(
    seed: int | torch.Tensor, shape, p: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The bool keep mask of shape `shape` (rows: every dimension but the last) that the
    kernels draw for `seed` (for checks and the CPU references)."""
    seed = int(seed.item()) if isinstance(seed, torch.Tensor) else int(seed)
    shape = tuple(shape)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return keep_mask_reference(seed, rows, shape[-1], p, device).reshape(shape)


def check_p(op: str, p: float) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{op}: dropout probability p must lie in [0, 1), got {p!r}")
