"""softmax_dropout against TESTING.md: numeric gate, masks, dropout statistics and determinism,
layouts, special values. Its paths (two-pass kernels, reference, custom op, torch.compile), module
and bad input: test_softmax_dropout_paths.py; the GPU's own tests: test_softmax_dropout_gpu.py.

The same tests run on CUDA when there is a GPU, else on CPU tensors (the Triton kernels under
TRITON_INTERPRET=1, as CI runs them; the PyTorch reference otherwise). Dropout is checked
against PyTorch's own composition with the kernel's mask, which `dropout_keep_mask` computes
from the seed the op draws after `torch.manual_seed(SEED)`.
"""

import math

import pytest
import torch

from gpushape.kernels.attention.softmax_dropout import (
    SoftmaxDropout,
    draw_seed,
    dropout_keep_mask,
    softmax_dropout,
    softmax_dropout_fwd,
)

from ._softmax_cases import (
    DEV,
    DTYPES,
    SEED,
    gate,
    keep_fraction_ok,
    randn,
    seeded,
    torch_composition,
)

# ---------------------------------------------------------------------------------------------
# Numeric gate
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 127, 1023, 1024, 1025, 1500, 4096, 8191])
def test_gate_feature_sizes(dtype, n):
    gate(randn(3, n, dtype=dtype), 0.17)


@pytest.mark.parametrize("shape", [(1, 65), (7, 64), (2, 3, 65), (2, 2, 3, 33), (2, 2, 2, 3, 9)])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_gate_shapes(shape, p):
    gate(-2.3 + 0.5 * randn(*shape, dtype=torch.bfloat16), p)


def test_gate_float64_and_fp16_large_values():
    gate(randn(4, 37, dtype=torch.float64), 0.3, scale=0.7)
    near_max = 60000 + 100 * torch.randn(3, 70, device=DEV)
    gate(near_max.half().requires_grad_(), 0.2)
    for dtype in (torch.float16, torch.bfloat16):  # large logits, small differences
        gate((700 + 3 * torch.randn(3, 70, device=DEV)).to(dtype).requires_grad_(), 0.2)


def test_constant_rows_are_uniform():
    x = torch.full((3, 40), 2.5, device=DEV).requires_grad_()
    gate(x, 0.3)
    y = softmax_dropout(x, 0.0)
    torch.testing.assert_close(y, torch.full_like(y, 1 / 40))


def test_zero_rows():
    x = randn(0, 33)
    y = softmax_dropout(x, 0.3)
    y.backward(torch.randn_like(y))
    assert y.shape == (0, 33) and x.grad.shape == (0, 33)


def test_gradcheck_float64():
    x = randn(3, 5, dtype=torch.float64)
    mask = randn(5, dtype=torch.float64)
    fn = seeded(lambda x, m: softmax_dropout(x, 0.3, scale=0.7, attn_mask=m, is_causal=True))
    assert torch.autograd.gradcheck(fn, (x, mask))


# ---------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------


def test_bool_mask_broadcast_and_causal():
    x = randn(2, 3, 5, 7)
    attend = torch.rand(5, 7, device=DEV) > 0.4
    attend[:, 0] = True  # no row fully masked: PyTorch's softmax gives NaN there
    gate(x, 0.17, mask=attend)
    gate(x, 0.17, is_causal=True, scale=0.5)
    gate(x, 0.17, mask=attend, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_additive_mask_with_gradient(dtype):
    x = randn(2, 3, 4, 9, dtype=dtype)
    bias = randn(1, 3, 1, 9, dtype=dtype)  # e.g. a learned relative-position bias
    gate(x, 0.17, mask=bias, scale=0.125)


def test_additive_float32_mask_on_bf16_scores():
    x = randn(2, 6, 33, dtype=torch.bfloat16)
    mask = torch.randn(6, 33, device=DEV)
    ours = seeded(softmax_dropout)(x, 0.2, attn_mask=mask)
    ref = torch_composition(tuple(x.shape), 0.2)(x.double() + mask.double())
    assert (ours.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


# ---------------------------------------------------------------------------------------------
# Dropout: statistics, determinism, gradient
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.0, 0.17, 0.5, 0.9])
def test_generator_statistics_over_a_million(p):
    """The Philox draw the kernels use (here its PyTorch twin) over >= 1e6 elements."""
    keep = dropout_keep_mask(987654321, (1024, 1100), p)
    assert abs(keep.double().mean().item() - (1 - p)) <= 0.01
    keep_fraction_ok(keep, p)


@pytest.mark.parametrize("p", [0.17, 0.5, 0.9])
def test_kernel_mask_is_the_generator_mask(p):
    x = torch.randn(64, 1000, device=DEV)  # finite: every softmax value > 0
    torch.manual_seed(SEED)
    seed = draw_seed(DEV)
    y, _ = softmax_dropout_fwd(x, seed, p, 1.0, None, False)
    keep = y != 0
    assert torch.equal(keep, dropout_keep_mask(seed, x.shape, p, DEV))
    keep_fraction_ok(keep, p)


def test_same_seed_bitwise_and_rng_advances_like_torch():
    x = randn(5, 130, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        y = softmax_dropout(x, 0.4)
        (dx,) = torch.autograd.grad(y, x, dy)
        runs.append((y, dx, torch.rand(3, device=DEV)))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    torch.manual_seed(7)
    draw_seed(DEV)  # the op consumes exactly one seed draw from torch's generator
    assert torch.equal(runs[0][2], torch.rand(3, device=DEV))
    assert not torch.equal(softmax_dropout(x, 0.4), softmax_dropout(x, 0.4))


def test_repeated_backward_is_bitwise_equal():
    x = randn(6, 257)
    torch.manual_seed(3)
    y = softmax_dropout(x, 0.3, attn_mask=torch.randn(257, device=DEV))
    dy = torch.randn_like(y)
    first = torch.autograd.grad(y, x, dy, retain_graph=True)[0]
    for _ in range(50 if DEV == "cuda" else 3):
        assert torch.equal(torch.autograd.grad(y, x, dy, retain_graph=True)[0], first)


def test_dropped_positions_get_no_gradient():
    """dy at dropped positions never reaches dx (the gradient through dropout is zero there)."""
    x = randn(4, 77)
    torch.manual_seed(11)
    y = softmax_dropout(x, 0.5)
    dropped = y == 0
    assert dropped.any()
    dy = torch.randn_like(y)
    dy_other = torch.where(dropped, 100 * torch.randn_like(y), dy)
    dx = torch.autograd.grad(y, x, dy, retain_graph=True)[0]
    assert torch.equal(dx, torch.autograd.grad(y, x, dy_other)[0])


def test_p0_and_eval_equal_no_dropout_and_leave_rng_alone():
    x = randn(3, 7, 50, dtype=torch.float16)
    state = torch.get_rng_state() if DEV == "cpu" else torch.cuda.get_rng_state()
    plain = softmax_dropout(x, 0.0)
    module = SoftmaxDropout(0.5).eval()
    assert torch.equal(module(x), plain)
    assert torch.equal(softmax_dropout(x, 0.9, training=False), plain)
    after = torch.get_rng_state() if DEV == "cpu" else torch.cuda.get_rng_state()
    assert torch.equal(state, after)
    gate(x, 0.0)


# ---------------------------------------------------------------------------------------------
# Layouts: strided inputs give the contiguous result
# ---------------------------------------------------------------------------------------------


def same_as_contiguous(y, dx, y_ref, dx_ref):
    """The same dropped elements and the same values; on a GPU a strided layout may change
    Triton's register layout and with it the order of a row's sum, so values agree to rounding
    (the interpreter gives identical bits)."""
    assert torch.equal(y == 0, y_ref == 0)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(dx, dx_ref)


def run_seeded(x, dy, **kw):
    x = x.detach().requires_grad_()
    torch.manual_seed(5)
    y = softmax_dropout(x, 0.25, **kw)
    return y.detach(), torch.autograd.grad(y, x, dy)[0]


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset", "batch-transposed"])
def test_strided_inputs_match_contiguous(layout):
    base = torch.randn(6, 4, 66, device=DEV, dtype=torch.bfloat16)
    x = {
        "transposed": base[0].t().contiguous().t(),  # (4, 66) with column stride 4
        "sliced": base[..., ::2],
        "offset": base.reshape(-1)[5 : 5 + 4 * 33].view(4, 33),
        "batch-transposed": base.transpose(0, 1),  # rows not at one stride: 4-D row lookup
    }[layout]
    dy = torch.randn(x.shape, device=DEV, dtype=x.dtype)
    y, dx = run_seeded(x, dy, is_causal=x.dim() == 3)
    y_ref, dx_ref = run_seeded(x.contiguous(), dy, is_causal=x.dim() == 3)
    same_as_contiguous(y, dx, y_ref, dx_ref)


def test_expanded_grad_output_and_mask():
    x = torch.randn(5, 40, device=DEV)
    dy = torch.randn(40, device=DEV).expand(5, 40)  # stride 0
    mask = torch.randn(40, device=DEV).expand(5, 40)
    y, dx = run_seeded(x, dy, attn_mask=mask)
    y_ref, dx_ref = run_seeded(x, dy.contiguous(), attn_mask=mask.contiguous())
    same_as_contiguous(y, dx, y_ref, dx_ref)


# ---------------------------------------------------------------------------------------------
# Special values
# ---------------------------------------------------------------------------------------------


def test_minus_inf_entries():
    x = torch.randn(4, 70, device=DEV)
    x[:, ::7] = -math.inf
    gate(x.requires_grad_(), 0.3)
    y = softmax_dropout(x, 0.3)
    assert (y[:, ::7] == 0).all()


@pytest.mark.parametrize("how", ["inf", "bool-mask", "causal"])
def test_fully_masked_row_gives_zeros(how):
    """Documented: a row with nothing to attend to outputs zeros (PyTorch gives NaN)."""
    x = randn(3, 4, 9).detach()
    kw = {}
    if how == "inf":
        x[1, 2] = -math.inf
    elif how == "bool-mask":
        attend = torch.ones(4, 9, dtype=torch.bool, device=DEV)
        attend[2] = False
        kw = dict(attn_mask=attend)
    else:  # query 0 may see only key 0 (causal), which the mask hides
        x = randn(3, 6, 4).detach()
        kw = dict(is_causal=True, attn_mask=torch.tensor([False, True, True, True], device=DEV))
    x.requires_grad_()
    y = softmax_dropout(x, 0.2, **kw)
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    row = (1, 2) if how != "causal" else (slice(None), 0)
    assert (y[row] == 0).all() and (dx[row] == 0).all()
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()


def test_nan_propagates_to_its_row_only():
    x = randn(3, 50).detach()
    x[1, 7] = math.nan
    x.requires_grad_()
    y = seeded(softmax_dropout)(x, 0.3)
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert torch.isnan(y[1]).all() and torch.isnan(dx[1]).all()
    clean = x.detach().clone()
    clean[1, 7] = 0.0
    y_clean = seeded(softmax_dropout)(clean, 0.3)
    assert torch.equal(y[[0, 2]], y_clean[[0, 2]])
