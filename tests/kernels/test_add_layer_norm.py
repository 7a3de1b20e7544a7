"""add_layer_norm: (LayerNorm(x + residual), x + residual) against PyTorch's composition, both
outputs and every gradient; odd sizes, layouts, special values, bad input, torch.compile, CUDA
graphs. CPU lane: TRITON_INTERPRET=1 on small shapes; GPU lane: `pytest -m gpu`.
"""

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels._norm_common import norm_tuning
from gpushape.kernels.add_layer_norm import AddLayerNorm, add_layer_norm

from . import _norm_cases as nc
from ._numeric import assert_gate

CI_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1025, 1500]
GPU_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1024, 1025, 1500, 4096, 8191, 8192, 16384, 16385,
         65536, 65537]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


def _torch_add_layer_norm(x, residual, weight, bias, eps=1e-5):
    s = x + residual
    return F.layer_norm(s, s.shape[-1:], weight, bias, eps), s


CASE = nc.NormCase(name="add_layer_norm", ours=add_layer_norm, torch_fn=_torch_add_layer_norm,
                   row_inputs=2, param_names=("weight", "bias"))


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


def test_without_weight_and_bias(interpret):
    nc.gate(CASE, (7, 65), torch.float32, affine=False)


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
    x, r, w, b = CASE.inputs((3, 5, 33), torch.float32)
    op = torch.ops.gpushape.add_layer_norm.default
    torch.library.opcheck(op, (x, r, w, b, 1e-5))
    torch.library.opcheck(op, (x, r, None, None, 1e-5))


def test_reference_path_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for n in (1, 65, 1500):
        nc.gate(CASE, (7, n), torch.bfloat16)


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


@pytest.mark.parametrize("bad,error,message", [
    (dict(x=torch.arange(12).view(3, 4)), TypeError, "x must be float32, float16 or bfloat16"),
    (dict(residual=torch.ones(3, 4, device="meta")), RuntimeError,
     "all tensors must be on one device"),
    (dict(residual=torch.ones(3, 5)), ValueError, r"residual has shape \(3, 5\), expected"),
    (dict(residual=torch.ones(3, 4, dtype=torch.float16)), TypeError, "residual is torch.float16"),
    (dict(weight=torch.ones(5)), ValueError, r"weight has shape \(5,\), expected \(4,\)"),
    (dict(x=torch.ones(3, 0), residual=torch.ones(3, 0)), ValueError, "no features to normalise"),
    (dict(eps=float("nan")), ValueError, "eps must be a finite number >= 0"),
    (dict(eps=-1.0), ValueError, "eps must be a finite number >= 0"),
])
def test_bad_input_raises_clear_error(bad, error, message):
    args = dict(x=torch.ones(3, 4), residual=torch.ones(3, 4), weight=torch.ones(4),
                bias=torch.ones(4), eps=1e-5)
    args.update(bad)
    with pytest.raises(error, match=message):
        add_layer_norm(**args)


# ---- GPU lane ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_gate(dtype, n):
    nc.gate(CASE, (7, n), dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 768), (1, 768), (65537, 64), (4, 33, 768), (300, 16384)])
def test_gpu_shapes(shape):
    nc.gate(CASE, shape, torch.bfloat16, device="cuda")


@pytest.mark.gpu
def test_gpu_strided_constant_and_nan():
    cuda = nc.on_device(CASE, "cuda")
    nc.assert_same_as_contiguous(cuda, lambda t: t.transpose(0, 1), (4096, 8), torch.bfloat16)
    nc.constant_rows(cuda, torch.bfloat16, n=4096)
    nc.assert_nan_propagates(cuda, torch.float32, n=4096)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [768, 65537])
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
