"""add_layer_norm against (F.layer_norm(x + residual), x + residual): the shared matrix
(_norm_suite.NormSuite) on both outputs and every gradient, plus what is particular to this op:
one output unused, the module, errors, float32 parameters, opcheck, meta tensors.
CPU lane: TRITON_INTERPRET=1 on small shapes; GPU lane: `pytest -m gpu`.
"""

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels.norms.add_layer_norm import AddLayerNorm, add_layer_norm

from . import _norm_cases as nc
from ._norm_suite import NormSuite
from ._numeric import assert_gate


def _torch_add_layer_norm(x, residual, weight, bias, eps=1e-5):
    s = x + residual
    return F.layer_norm(s, s.shape[-1:], weight, bias, eps), s


CASE = nc.NormCase(
    name="add_layer_norm",
    ours=add_layer_norm,
    torch_fn=_torch_add_layer_norm,
    row_inputs=2,
    param_names=("weight", "bias"),
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


class TestAddLayerNorm(NormSuite):
    case = CASE


def test_only_one_output_used(interpret):
    # Only y used: no gradient reaches s directly. Only s used: d(x) = d(residual) = ds.
    x, r, w, b = CASE.inputs((4, 65), torch.float32)
    y, _ = add_layer_norm(x, r, w, b)
    g = torch.randn_like(y)
    y.backward(g)
    x2, r2, w2, b2 = (t.detach().double().requires_grad_() for t in (x, r, w, b))
    F.layer_norm(x2 + r2, (65,), w2, b2).backward(g.double())
    xt, rt = (t.detach().requires_grad_() for t in (x, r))
    F.layer_norm(xt + rt, (65,), w.detach(), b.detach()).backward(g)
    assert_gate("grad of x, y only", x.grad, xt.grad, x2.grad)
    assert torch.equal(x.grad, r.grad)
    x.grad = r.grad = None
    _, s = add_layer_norm(x, r, w, b)
    s.backward(g)
    assert torch.equal(x.grad, g) and torch.equal(r.grad, g)


def test_float32_parameters_with_bfloat16_input(interpret):
    x, r, w, b = CASE.inputs((7, 129), torch.bfloat16, param_dtype=torch.float32)
    y, s = add_layer_norm(x, r, w, b)
    assert y.dtype == s.dtype == torch.bfloat16
    ref = F.layer_norm(x.double() + r.double(), (129,), w.double(), b.double())
    assert_gate("output", y, F.layer_norm((x + r).float(), (129,), w, b).bfloat16(), ref)


def test_opcheck(interpret):
    x, r, w, b = CASE.inputs((3, 5, 33), torch.float32)
    op = torch.ops.gpushape.add_layer_norm.default
    torch.library.opcheck(op, (x, r, w, b, 1e-5))
    torch.library.opcheck(op, (x, r, None, None, 1e-5))


def test_meta_tensors_give_shapes():
    x = torch.empty(4, 9, 768, device="meta", dtype=torch.bfloat16)
    y, s = add_layer_norm(x, x, torch.empty(768, device="meta", dtype=torch.bfloat16))
    assert y.shape == s.shape == x.shape and y.device.type == "meta"


def test_module_loads_layer_norm_state_dict(interpret):
    ln = torch.nn.LayerNorm(65)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    fused = AddLayerNorm(65)
    fused.load_state_dict(ln.state_dict(), strict=True)
    x, r = torch.randn(3, 4, 65), torch.randn(3, 4, 65)
    y, s = fused(x, r)
    ref = F.layer_norm(x.double() + r.double(), (65,), ln.weight.double(), ln.bias.double())
    assert_gate("module output", y, ln(x + r), ref)
    assert torch.equal(s, x + r)


@pytest.mark.parametrize(
    "bad,error,message",
    [
        (dict(x=torch.arange(12).view(3, 4)), TypeError, "x must be float32, float16 or bfloat16"),
        (
            dict(residual=torch.ones(3, 4, device="meta")),
            RuntimeError,
            "all tensors must be on one device",
        ),
        (dict(residual=torch.ones(3, 5)), ValueError, r"residual has shape \(3, 5\), expected"),
        (
            dict(residual=torch.ones(3, 4, dtype=torch.float16)),
            TypeError,
            "residual is torch.float16",
        ),
        (dict(weight=torch.ones(5)), ValueError, r"weight has shape \(5,\), expected \(4,\)"),
        (
            dict(x=torch.ones(3, 0), residual=torch.ones(3, 0)),
            ValueError,
            "no features to normalise",
        ),
        (dict(eps=float("nan")), ValueError, "eps must be a finite number >= 0"),
        (dict(eps=-1.0), ValueError, "eps must be a finite number >= 0"),
    ],
)
def test_bad_input_raises_clear_error(bad, error, message):
    args = dict(
        x=torch.ones(3, 4),
        residual=torch.ones(3, 4),
        weight=torch.ones(4),
        bias=torch.ones(4),
        eps=1e-5,
    )
    args.update(bad)
    with pytest.raises(error, match=message):
        add_layer_norm(**args)
