"""softmax_dropout's paths and surface against TESTING.md: the two-pass kernels of long rows, the
kernels against the reference path, the custom ops under opcheck and torch.compile, the module,
and bad input. The numerics, dropout, masks, layouts and special values: test_softmax_dropout.py.

CPU or CUDA as test_softmax_dropout.py (the Triton kernels under TRITON_INTERPRET=1 on the CPU).
"""

import math

import pytest
import torch

from gpushape.kernels.attention import softmax_dropout as sd
from gpushape.kernels.attention._softmax_reference import backward_reference, forward_reference
from gpushape.kernels.attention.softmax_dropout import (
    SoftmaxDropout,
    draw_seed,
    softmax_dropout,
    softmax_dropout_bwd,
    softmax_dropout_fwd,
)

from ._softmax_cases import DEV, SEED, gate, randn, seeded

# ---------------------------------------------------------------------------------------------
# Paths: looped (long rows), reference (CPU), custom-op registration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, n, chunk",
    [(torch.float32, 65, 32), (torch.bfloat16, 200, 64), (torch.float16, 1025, 512)],
    ids=str,
)
def test_long_rows_take_the_two_pass_kernels(monkeypatch, dtype, n, chunk):
    """Small stand-ins for rows past SINGLE_PASS_MAX_N (the GPU tests run the real sizes)."""
    x = -2.3 + 0.5 * randn(3, n, dtype=dtype)
    torch.manual_seed(SEED)
    single = softmax_dropout(x.detach(), 0.17)
    monkeypatch.setattr(sd, "SINGLE_PASS_MAX_N", 64)
    monkeypatch.setattr(sd, "_LOOP_CHUNK", chunk)
    assert sd._tiling(n, 3)[0]
    gate(x, 0.17)
    gate(x, 0.17, is_causal=True, scale=2.0)
    torch.manual_seed(SEED)
    assert torch.equal(softmax_dropout(x.detach(), 0.17) != 0, single != 0)


def test_kernel_matches_reference_path(interpret):
    x = torch.randn(2, 5, 70, device=DEV)
    mask = torch.randn(5, 70, device=DEV)
    seed = draw_seed(DEV)
    y, stats = softmax_dropout_fwd(x, seed, 0.3, 0.5, mask, True)
    y_ref, stats_ref = forward_reference(x, seed, 0.3, 0.5, mask, True)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(stats, stats_ref)
    dy = torch.randn_like(x)
    dx = softmax_dropout_bwd(dy, x, stats, seed, 0.3, 0.5, mask, True, 0.5)
    torch.testing.assert_close(
        dx, backward_reference(dy, x, stats, seed, 0.3, 0.5, mask, True, 0.5)
    )


def test_opcheck():
    x = torch.randn(3, 40, device=DEV)
    seed = draw_seed(DEV)
    torch.library.opcheck(softmax_dropout_fwd, (x, seed, 0.2, 1.0, None, False))
    torch.library.opcheck(
        softmax_dropout_fwd, (x, None, 0.0, 0.5, torch.randn(40, device=DEV), True)
    )
    _, stats = softmax_dropout_fwd(x, seed, 0.2, 1.0, None, False)
    torch.library.opcheck(
        softmax_dropout_bwd, (torch.randn_like(x), x, stats, seed, 0.2, 1.0, None, False, 1.0)
    )


def test_compile_fullgraph_matches_eager():
    backend = "inductor" if DEV == "cuda" else "aot_eager"
    fn = lambda x: softmax_dropout(x, 0.3, scale=0.5, is_causal=True)
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    x = randn(2, 6, 6)
    dy = torch.randn_like(x)
    with torch._inductor.config.patch(fallback_random=True):
        results = []
        for f in (fn, compiled):
            torch.manual_seed(9)
            y = f(x)
            results.append((y, torch.autograd.grad(y, x, dy)[0]))
    assert torch.equal(results[0][0], results[1][0])  # the same kernel on the same seed
    torch.testing.assert_close(results[0][1], results[1][1])


def test_module():
    module = SoftmaxDropout(p=0.3, scale=0.5)
    x = randn(2, 3, 9)
    assert "p=0.3" in repr(module)
    y = seeded(module)(x)
    assert torch.equal(y, seeded(softmax_dropout)(x, 0.3, scale=0.5))


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1.0, -0.1, math.nan, 1.5, "0.1"])
def test_bad_p(p):
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\)"):
        softmax_dropout(torch.randn(2, 3), p)
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\)"):
        SoftmaxDropout(p)


BAD_INPUT = {  # case: (x, keyword arguments, error, message)
    "int": (torch.ones(2, 4, dtype=torch.int32), {}, TypeError, "must be float32, float16"),
    "bool": (torch.ones(2, 4, dtype=torch.bool), {}, TypeError, "must be float32, float16"),
    "scalar": (torch.tensor(1.0), {}, ValueError, "last dim of size >= 1"),
    "no-columns": (torch.ones(2, 0), {}, ValueError, "last dim of size >= 1"),
    "causal-1d": (torch.ones(4), dict(is_causal=True), ValueError, "at least 2 dims"),
    "mask-shape": (
        torch.ones(2, 4),
        dict(attn_mask=torch.zeros(3)),
        ValueError,
        r"attn_mask of shape \(3,\) does not broadcast",
    ),
    "mask-grows": (
        torch.ones(2, 4),
        dict(attn_mask=torch.zeros(3, 2, 4)),
        ValueError,
        "does not broadcast to x's shape",
    ),
    "mask-int": (
        torch.ones(2, 4),
        dict(attn_mask=torch.zeros(4, dtype=torch.int64)),
        TypeError,
        "attn_mask must be bool",
    ),
    "mask-device": (
        torch.ones(2, 4),
        dict(attn_mask=torch.zeros(4, device="meta")),
        RuntimeError,
        "all tensors must be on one device",
    ),
    "scale-tensor": (
        torch.ones(2, 4),
        dict(scale=torch.tensor(0.5)),
        TypeError,
        "scale must be a Python number",
    ),
    "not-a-tensor": ([[1.0, 2.0]], {}, TypeError, "x must be a tensor"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input(case):
    x, kw, error, message = BAD_INPUT[case]
    with pytest.raises(error, match=message):
        softmax_dropout(x, 0.1, **kw)
