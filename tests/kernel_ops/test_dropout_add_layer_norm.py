"""dropout_add_layer_norm against F.layer_norm(where(keep, x / (1 - p), 0) + residual) with the
kernel's own mask (regenerated from the seed by the plain-PyTorch Philox): the output and every
gradient through the numeric gate, the mask's statistics, p = 0 and evaluation, rows wider than
the kernel holds, errors, opcheck, meta tensors and the CPU reference path.
CPU lane: TRITON_INTERPRET=1 on small shapes; GPU lane: `pytest -m gpu`.
"""

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels.attention._philox import keep_mask_reference
from gpushape.kernels.norms import dropout_add_layer_norm as dal
from gpushape.kernels.norms.dropout_add_layer_norm import dropout_add_layer_norm

from ._numeric import gate_forward_backward

OP = torch.ops.gpushape.dropout_add_layer_norm.default
SEED = 0x1234_5678_9ABC


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(shape, dtype, *, affine=True, device=None):
    device = device or _device()
    n = shape[-1]
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    r = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    if not affine:
        return x, r, None, None
    w = (1 + 0.5 * torch.randn(n, device=device)).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(n, device=device)).to(dtype).requires_grad_()
    return x, r, w, b


def _keep(shape, p, device):
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return keep_mask_reference(SEED, rows, shape[-1], p, device).reshape(shape)


def _composition(keep, p, eps=1e-5):
    """PyTorch's own ops with the kernel's mask: dropout rounds x / (1 - p) to x's dtype."""

    def fn(x, r, w=None, b=None):
        xd = torch.where(keep, x * (1.0 / (1.0 - p)), 0.0) if p > 0 else x
        return F.layer_norm(xd + r, x.shape[-1:], w, b, eps)

    return fn


def _ours(p, eps=1e-5):
    def fn(x, r, w=None, b=None):
        seed = torch.tensor([SEED], dtype=torch.int64, device=x.device)
        return OP(x, r, w, b, eps, p, seed if p > 0 else None)[0]

    return fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "p"), [((6, 40), 0.1), ((2, 3, 96), 0.5), ((5, 17), 0.0)])
def test_output_and_every_gradient(interpret, dtype, shape, p):
    inputs = _inputs(shape, dtype)
    keep = _keep(shape, p, inputs[0].device)
    gate_forward_backward(_ours(p), _composition(keep, p), inputs, names=("x", "r", "w", "b"))


def test_without_affine_parameters(interpret):
    x, r, _, _ = _inputs((4, 24), torch.float32, affine=False)
    keep = _keep((4, 24), 0.2, x.device)
    gate_forward_backward(_ours(0.2), _composition(keep, 0.2), (x, r), names=("x", "r"))


def test_float64(interpret):
    inputs = _inputs((3, 33), torch.float64)
    keep = _keep((3, 33), 0.3, inputs[0].device)
    gate_forward_backward(_ours(0.3), _composition(keep, 0.3), inputs, names=("x", "r", "w", "b"))


def test_dropped_share_and_gradient_zeros(interpret):
    p = 0.25
    x, r, w, b = _inputs((32, 256), torch.float32)
    y = _ours(p)(x, r, w, b)
    y.backward(torch.ones_like(y))
    dropped = x.grad == 0
    share = dropped.float().mean().item()
    assert abs(share - p) < 0.02, share  # 8192 draws: 4 standard deviations
    assert torch.equal(dropped, ~_keep((32, 256), p, x.device))


def test_functional_draws_a_new_mask_each_call_repeatably(interpret):
    x, r, w, b = (t.detach() for t in _inputs((8, 64), torch.float32))
    torch.manual_seed(3)
    first = dropout_add_layer_norm(x, r, w, b, p=0.5)
    second = dropout_add_layer_norm(x, r, w, b, p=0.5)
    torch.manual_seed(3)
    again = dropout_add_layer_norm(x, r, w, b, p=0.5)
    assert torch.equal(first, again) and not torch.equal(first, second)


def test_evaluation_and_p_zero_are_layer_norm_of_the_sum(interpret):
    x, r, w, b = (t.detach() for t in _inputs((5, 48), torch.float32))
    expected = F.layer_norm(x + r, (48,), w, b)
    for y in (dropout_add_layer_norm(x, r, w, b, p=0.5, training=False),
              dropout_add_layer_norm(x, r, w, b, p=0.0)):  # fmt: skip
        torch.testing.assert_close(y, expected)


def test_p_zero_gives_one_gradient_to_x_and_residual(interpret):
    x, r, w, b = _inputs((4, 32), torch.float32)
    dropout_add_layer_norm(x, r, w, b, p=0.0).sum().backward()
    assert torch.equal(x.grad, r.grad)


def test_rows_wider_than_the_kernel_run_the_unfused_ops(interpret, monkeypatch):
    monkeypatch.setattr(dal, "MAX_N", 16)
    x, r, w, b = _inputs((3, 40), torch.float32)
    y = dropout_add_layer_norm(x, r, w, b, p=0.0)
    torch.testing.assert_close(y, F.layer_norm(x + r, (40,), w, b))
    y = dropout_add_layer_norm(x, r, w, b, p=0.5)
    y.sum().backward()
    assert y.shape == x.shape and x.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        (dict(p=1.0), ValueError, r"p must lie in \[0, 1\)"),
        (dict(p=-0.1), ValueError, "p must lie"),
        (dict(p=True), ValueError, "p must lie"),
        (dict(eps=float("nan")), ValueError, "eps must be"),
        (dict(residual=torch.zeros(4, 9)), ValueError, "residual is"),
        (dict(x=torch.zeros(4, 8, dtype=torch.int64)), TypeError, "must be float32"),
        (dict(weight=torch.ones(7)), ValueError, r"weight has shape \(7,\)"),
        (dict(x=torch.zeros(4, 0), residual=torch.zeros(4, 0)), ValueError, "no features"),
        (dict(residual=[1.0]), TypeError, "residual must be a tensor"),
    ],
)
def test_bad_inputs_get_clear_errors(kwargs, error, says):
    args = dict(x=torch.zeros(4, 8), residual=torch.zeros(4, 8), weight=None, p=0.1)
    args.update(kwargs)
    with pytest.raises(error, match=says):
        dropout_add_layer_norm(**args)


def test_opcheck(interpret):
    x, r, w, b = (t.detach() for t in _inputs((3, 5, 33), torch.float32))
    seed = torch.tensor([SEED], dtype=torch.int64, device=x.device)
    torch.library.opcheck(OP, (x, r, w, b, 1e-5, 0.1, seed))
    torch.library.opcheck(OP, (x, r, None, None, 1e-5, 0.0, None))


def test_meta_tensors_give_shapes():
    x = torch.empty(4, 9, 768, device="meta", dtype=torch.bfloat16)
    y = dropout_add_layer_norm(x, x, torch.empty(768, device="meta", dtype=torch.bfloat16), p=0.1)
    assert y.shape == x.shape and y.device.type == "meta"


def test_reference_path_matches_the_kernels(interpret):
    """CPU tensors without TRITON_INTERPRET take the plain-PyTorch reference: same mask, same
    numbers as the kernels."""
    x, r, w, b = (t.detach().cpu() for t in _inputs((6, 40), torch.float32, device="cpu"))
    seed = torch.tensor([SEED], dtype=torch.int64)
    kernel = dal.forward(x, r, w, b, 1e-5, 0.3, seed)
    reference = dal._reference_forward(x, r, w, b, 1e-5, 0.3, seed)
    for k, ref in zip(kernel, reference):
        torch.testing.assert_close(k, ref)
    dy = torch.randn_like(x)
    _, s, mean, rstd = kernel
    for k, ref in zip(dal.backward(dy, s, w, b, mean, rstd, seed, 0.3),
                      dal._reference_backward(dy, s, w, b, mean, rstd, seed, 0.3)):  # fmt: skip
        torch.testing.assert_close(k, ref)


@pytest.mark.gpu
def test_bert_shape_bfloat16_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    shape, p = (16, 512, 768), 0.1
    inputs = _inputs(shape, torch.bfloat16, device="cuda")
    keep = _keep(shape, p, "cuda")
    results = gate_forward_backward(
        _ours(p), _composition(keep, p), inputs, names=("x", "r", "w", "b")
    )
    assert all(res.passed for res in results)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_functional_eager_path_output_and_every_gradient(interpret, dtype):
    """Plain tensors take the eager autograd.Function: same kernels, same gate; the seed it
    draws is the generator's next, so the reference rebuilds that mask."""
    p, shape = 0.2, (5, 48)
    inputs = _inputs(shape, dtype)
    torch.manual_seed(7)
    seed = int(dal.draw_seed(inputs[0].device).item())
    keep = keep_mask_reference(seed, 5, 48, p, inputs[0].device)

    def ours(x, r, w, b):
        torch.manual_seed(7)
        return dropout_add_layer_norm(x, r, w, b, 1e-5, p=p)

    gate_forward_backward(ours, _composition(keep, p), inputs, names=("x", "r", "w", "b"))
