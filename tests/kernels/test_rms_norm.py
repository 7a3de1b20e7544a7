"""rms_norm: the numeric gate against F.rms_norm, forward and every gradient; odd sizes,
layouts, special values, bad input, torch.compile, CUDA graphs. CPU lane: TRITON_INTERPRET=1 on
small shapes; GPU lane: `pytest -m gpu`.
"""

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels._norm_common import norm_tuning
from gpushape.kernels.rms_norm import RMSNorm, rms_norm

from . import _norm_cases as nc
from ._numeric import assert_gate

CI_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1025, 1500]
GPU_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1024, 1025, 1500, 4096, 8191, 8192, 16384, 16385,
         65536, 65537]
EPS = 1e-6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


CASE = nc.NormCase(name="rms_norm", ours=lambda x, w: rms_norm(x, w, EPS),
                   torch_fn=lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS),
                   row_inputs=1, param_names=("weight",))


# ---- CPU lane: Triton kernels in the interpreter --------------------------------------------
@pytest.mark.parametrize("n", CI_N)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_odd_sizes(interpret, dtype, n):
    nc.gate(CASE, (7, n), dtype)


@pytest.mark.parametrize("n", [65, 1023])
def test_gate_float16(interpret, n):
    nc.gate(CASE, (7, n), torch.float16)


def test_persistent_backward_walks_many_tiles(interpret):
    nc.gate(CASE, (37, 1500), torch.bfloat16)


@pytest.mark.parametrize("shape", [(0, 33), (1, 33), (2, 3, 33), (2, 2, 3, 33)])
def test_leading_dims(interpret, shape):
    nc.gate(CASE, shape, torch.float32)


@pytest.mark.parametrize("n,chunk", [(65, 32), (1500, 512)])
def test_looped_path(interpret, n, chunk):
    with norm_tuning(fwd_max_block_n=32, bwd_max_block_n=32, looped_block_n=chunk):
        nc.gate(CASE, (5, n), torch.bfloat16)
        nc.gate(CASE, (3, n), torch.float32)


def test_without_weight(interpret):
    nc.gate(CASE, (7, 65), torch.float32, affine=False)


def test_float32_weight_with_bfloat16_input(interpret):
    x, w = CASE.inputs((7, 129), torch.bfloat16, param_dtype=torch.float32)
    y = rms_norm(x, w, EPS)
    assert y.dtype == torch.bfloat16
    y.backward(torch.randn_like(y))
    assert w.grad.dtype == torch.float32
    ref = F.rms_norm(x.double(), (129,), w.double(), EPS)
    assert_gate("output", y, F.rms_norm(x.float(), (129,), w, EPS).bfloat16(), ref)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
def test_strided_inputs_equal_contiguous(interpret, layout):
    views = {
        "transposed": (lambda t: t.transpose(0, 1), (65, 6)),
        "sliced": (lambda t: t[..., ::2], (6, 130)),
        "offset": (lambda t: t[1:], (7, 65)),
    }
    make_view, base_shape = views[layout]
    nc.assert_same_as_contiguous(CASE, make_view, base_shape, torch.bfloat16)


def test_expanded_grad_output_equals_contiguous(interpret):
    nc.assert_same_as_contiguous(CASE, lambda t: t, (4, 65), torch.float32,
                                 grad_view=lambda g: g[:1].expand_as(g))


def test_nan_propagates(interpret):
    nc.assert_nan_propagates(CASE, torch.float32)


def test_constant_rows(interpret):
    nc.constant_rows(CASE, torch.float32)


def test_values_near_float16_max(interpret):
    nc.near_float16_max(CASE)


def test_gradcheck_float64(interpret):
    nc.gradcheck_float64(CASE, (3, 7))


def test_torch_compile_fullgraph(interpret):
    nc.compiled_equals_eager(CASE, (2, 3, 65), torch.float32)


def test_opcheck(interpret):
    x, w = CASE.inputs((3, 5, 33), torch.float32)
    op = torch.ops.gpushape.rms_norm.default
    torch.library.opcheck(op, (x, w, 1e-6))
    torch.library.opcheck(op, (x, None, 1e-6))


def test_reference_path_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for n in (1, 65, 1500):
        nc.gate(CASE, (7, n), torch.bfloat16)


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


@pytest.mark.parametrize("bad,error,message", [
    (dict(x=torch.ones(3, 4, dtype=torch.bool)), TypeError, "x must be float32"),
    (dict(weight=torch.ones(4, dtype=torch.int32)), TypeError, "weight must be float32"),
    (dict(weight=torch.ones(4, device="meta")), RuntimeError, "all tensors must be on one device"),
    (dict(weight=torch.ones(3)), ValueError, r"weight has shape \(3,\), expected \(4,\)"),
    (dict(x=torch.ones(0)), ValueError, "no features to normalise"),
    (dict(eps=-1e-6), ValueError, "eps must be a finite number >= 0"),
])
def test_bad_input_raises_clear_error(bad, error, message):
    args = dict(x=torch.ones(3, 4), weight=torch.ones(4), eps=EPS)
    args.update(bad)
    with pytest.raises(error, match=message):
        rms_norm(**args)


# ---- GPU lane ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_gate(dtype, n):
    nc.gate(CASE, (7, n), dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 768), (1, 768), (65537, 64), (4, 33, 4096), (300, 16384)])
def test_gpu_shapes(shape):
    nc.gate(CASE, shape, torch.bfloat16, device="cuda")


@pytest.mark.gpu
def test_gpu_strided_constant_and_nan():
    cuda = nc.on_device(CASE, "cuda")
    nc.assert_same_as_contiguous(cuda, lambda t: t[..., ::2], (8, 8192), torch.bfloat16)
    nc.constant_rows(cuda, torch.bfloat16, n=4096)
    nc.assert_nan_propagates(cuda, torch.float32, n=4096)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 65537])
def test_gpu_torch_compile(n):
    nc.compiled_equals_eager(CASE, (64, n), torch.bfloat16, device="cuda")


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    nc.cuda_graph_matches_eager(CASE, (256, 4096), torch.bfloat16)


@pytest.mark.gpu
def test_gpu_backward_is_deterministic():
    nc.repeated_backward_is_bitwise_equal(CASE, (4096, 1024), torch.bfloat16, repeats=50)


@pytest.mark.gpu
def test_gpu_past_2_31_elements():
    nc.rows_past_2_31_elements(CASE, n=4096)
