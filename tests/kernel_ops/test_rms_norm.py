"""rms_norm against F.rms_norm: the shared matrix (_norm_suite.NormSuite) plus what is particular
to this op: the module, errors, float32 weight with bfloat16 input, opcheck, meta tensors.
CPU lane: TRITON_INTERPRET=1 on small shapes; GPU lane: `pytest -m gpu`.
"""

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels.norms.rms_norm import RMSNorm, rms_norm

from . import _norm_cases as nc
from ._norm_suite import NormSuite
from ._numeric import assert_gate

EPS = 1e-6
CASE = nc.NormCase(
    name="rms_norm",
    ours=lambda x, w: rms_norm(x, w, EPS),
    torch_fn=lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS),
    row_inputs=1,
    param_names=("weight",),
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


class TestRMSNorm(NormSuite):
    case = CASE


def test_float32_weight_with_bfloat16_input(interpret):
    x, w = CASE.inputs((7, 129), torch.bfloat16, param_dtype=torch.float32)
    y = rms_norm(x, w, EPS)
    assert y.dtype == torch.bfloat16
    y.backward(torch.randn_like(y))
    assert w.grad.dtype == torch.float32
    ref = F.rms_norm(x.double(), (129,), w.double(), EPS)
    assert_gate("output", y, F.rms_norm(x.float(), (129,), w, EPS).bfloat16(), ref)


def test_opcheck(interpret):
    x, w = CASE.inputs((3, 5, 33), torch.float32)
    op = torch.ops.gpushape.rms_norm.default
    torch.library.opcheck(op, (x, w, 1e-6))
    torch.library.opcheck(op, (x, None, 1e-6))


def test_meta_tensors_give_shapes():
    x = torch.empty(4, 9, 4096, device="meta", dtype=torch.bfloat16)
    y = rms_norm(x, torch.empty(4096, device="meta", dtype=torch.bfloat16))
    assert y.shape == x.shape and y.device.type == "meta"


def test_module_loads_rms_norm_state_dict(interpret):
    stock = torch.nn.RMSNorm(65, eps=EPS)
    with torch.no_grad():
        stock.weight.normal_()
    fused = RMSNorm(65, eps=EPS)
    fused.load_state_dict(stock.state_dict(), strict=True)
    x = torch.randn(3, 4, 65)
    ref = F.rms_norm(x.double(), (65,), stock.weight.double(), EPS)
    assert_gate("module output", fused(x), stock(x), ref)


@pytest.mark.parametrize(
    "bad,error,message",
    [
        (dict(x=torch.ones(3, 4, dtype=torch.bool)), TypeError, "x must be float32"),
        (dict(weight=torch.ones(4, dtype=torch.int32)), TypeError, "weight must be float32"),
        (
            dict(weight=torch.ones(4, device="meta")),
            RuntimeError,
            "all tensors must be on one device",
        ),
        (dict(weight=torch.ones(3)), ValueError, r"weight has shape \(3,\), expected \(4,\)"),
        (dict(x=torch.ones(0)), ValueError, "no features to normalise"),
        (dict(eps=-1e-6), ValueError, "eps must be a finite number >= 0"),
    ],
)
def test_bad_input_raises_clear_error(bad, error, message):
    args = dict(x=torch.ones(3, 4), weight=torch.ones(4), eps=EPS)
    args.update(bad)
    with pytest.raises(error, match=message):
        rms_norm(**args)
