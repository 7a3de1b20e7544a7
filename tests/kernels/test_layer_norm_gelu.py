"""layer_norm_gelu: the numeric gate against F.gelu(F.layer_norm(...)), forward and every
gradient; odd sizes, layouts, special values, bad input, torch.compile, CUDA graphs.

CPU lane (CI): TRITON_INTERPRET=1 runs the Triton kernels in the interpreter on small shapes.
GPU lane (`pytest -m gpu`): the full matrix on CUDA.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels._norm_common import norm_tuning
from gpushape.kernels.layer_norm_gelu import LayerNormGELU, layer_norm_gelu

from . import _norm_cases as nc
from ._numeric import assert_gate, gate_forward_backward

CI_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1025, 1500]
GPU_N = [1, 2, 3, 63, 64, 65, 127, 1023, 1024, 1025, 1500, 4096, 8191, 8192, 16384, 16385,
         65536, 65537]
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


def case(approximate: str = "none", eps: float = 1e-5) -> nc.NormCase:
    return nc.NormCase(
        name=f"layer_norm_gelu[{approximate}]",
        ours=lambda x, w, b: layer_norm_gelu(x, w, b, eps, approximate),
        torch_fn=lambda x, w, b: F.gelu(F.layer_norm(x, x.shape[-1:], w, b, eps),
                                        approximate=approximate),
        row_inputs=1, param_names=("weight", "bias"))


# ---- CPU lane: Triton kernels in the interpreter --------------------------------------------
@pytest.mark.parametrize("n", CI_N)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_odd_sizes(interpret, dtype, n):
    nc.gate(case(), (7, n), dtype)


def test_bfloat16_with_erf_instead_of_the_fast_cdf(interpret):
    with norm_tuning(bf16_fast_gelu=False):
        nc.gate(case(), (7, 1023), torch.bfloat16)


@pytest.mark.parametrize("n", [65, 1023])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gate_float16_and_tanh(interpret, approximate, n):
    nc.gate(case(approximate), (7, n), torch.float16)
    nc.gate(case(approximate), (7, n), torch.float32)


@pytest.mark.parametrize("prefetch_depth", [1, 2])
def test_persistent_backward_walks_many_tiles(interpret, prefetch_depth):
    # 37 rows of 1500: more row tiles than backward programs, so each program loops and
    # prefetches (one or two tiles ahead), and the dweight/dbias partials of several programs
    # are added.
    limit = 0 if prefetch_depth == 1 else 64
    with norm_tuning(prefetch2_max_elems_per_thread=limit):
        nc.gate(case("tanh"), (37, 1500), torch.bfloat16)


@pytest.mark.parametrize("shape", [(0, 33), (1, 33), (7, 33), (2, 3, 33), (2, 2, 3, 33)])
def test_leading_dims(interpret, shape):
    nc.gate(case(), shape, torch.float32)


@pytest.mark.parametrize("n,chunk", [(65, 32), (1500, 512)])
def test_looped_path(interpret, n, chunk):
    # The multi-block path, reached at small N by lowering the single-block limits.
    with norm_tuning(fwd_max_block_n=32, bwd_max_block_n=32, looped_block_n=chunk):
        nc.gate(case(), (5, n), torch.bfloat16)
        nc.gate(case("tanh"), (3, n), torch.float32)


def test_without_weight_or_bias(interpret):
    nc.gate(case(), (7, 65), torch.float32, affine=False)
    x, w, b = case().inputs((7, 65), torch.float32)
    gate_forward_backward(lambda x, w: layer_norm_gelu(x, w, None),
                          lambda x, w: F.gelu(F.layer_norm(x, (65,), w, None)), (x, w),
                          names=["x", "weight"])
    gate_forward_backward(lambda x, b: layer_norm_gelu(x, None, b),
                          lambda x, b: F.gelu(F.layer_norm(x, (65,), None, b)), (x, b),
                          names=["x", "bias"])


def test_float32_parameters_with_bfloat16_input(interpret):
    x, w, b = case().inputs((7, 129), torch.bfloat16, param_dtype=torch.float32)
    y = layer_norm_gelu(x, w, b)
    assert y.dtype == torch.bfloat16
    y.backward(torch.randn_like(y))
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    ref = F.gelu(F.layer_norm(x.double(), (129,), w.double(), b.double()))
    torch_same = F.gelu(F.layer_norm(x.float(), (129,), w, b)).to(torch.bfloat16)
    assert_gate("output", y, torch_same, ref)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
def test_strided_inputs_equal_contiguous(interpret, layout):
    views = {
        "transposed": (lambda t: t.transpose(0, 1), (65, 6)),  # x: (6, 65) with stride (1, 6)
        "sliced": (lambda t: t[..., ::2], (6, 130)),
        "offset": (lambda t: t[1:], (7, 65)),
    }
    make_view, base_shape = views[layout]
    nc.assert_same_as_contiguous(case(), make_view, base_shape, torch.bfloat16)


def test_expanded_grad_output_equals_contiguous(interpret):
    nc.assert_same_as_contiguous(case(), lambda t: t, (4, 65), torch.float32,
                                 grad_view=lambda g: g[:1].expand_as(g))


def test_nan_propagates(interpret):
    nc.assert_nan_propagates(case(), torch.float32)


def test_constant_rows(interpret):
    nc.constant_rows(case(), torch.float32)
    nc.constant_rows(case("tanh"), torch.bfloat16)


def test_values_near_float16_max(interpret):
    nc.near_float16_max(case())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gradcheck_float64(interpret, approximate):
    nc.gradcheck_float64(case(approximate), (3, 7))


def test_torch_compile_fullgraph(interpret):
    nc.compiled_equals_eager(case(), (2, 3, 65), torch.float32)


def test_opcheck(interpret):
    x, w, b = case().inputs((3, 5, 33), torch.float32)
    op = torch.ops.gpushape.layer_norm_gelu.default
    torch.library.opcheck(op, (x, w, b, 1e-5, "tanh"))
    torch.library.opcheck(op, (x, None, b, 1e-5, "none"))
    empty = torch.empty(0, 33, requires_grad=True)
    torch.library.opcheck(op, (empty, w, b, 1e-5, "none"))


def test_no_rows_give_zero_parameter_gradients(interpret):
    x, w, b = case().inputs((0, 33), torch.float32, requires_grad=False)
    y, mean, rstd = torch.ops.gpushape.layer_norm_gelu(x, w, b, 1e-5, "none")
    dx, dw, db = torch.ops.gpushape.layer_norm_gelu_backward(y, x, w, b, mean, rstd, "none")
    assert dx.shape == (0, 33)
    assert dw.shape == db.shape == (33,) and not dw.any() and not db.any()


def test_reference_path_without_interpreter(monkeypatch):
    # CPU tensors without TRITON_INTERPRET=1 take the plain-PyTorch path: gate it too.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for n in (1, 65, 1500):
        nc.gate(case(), (7, n), torch.bfloat16)
    nc.gate(case("tanh"), (2, 3, 65), torch.float32)


def test_meta_tensors_give_shapes():
    x = torch.empty(4, 9, 768, device="meta", dtype=torch.bfloat16)
    w = torch.empty(768, device="meta", dtype=torch.bfloat16)
    y = layer_norm_gelu(x, w, w)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "meta"


def test_module_loads_layer_norm_state_dict(interpret):
    ln = torch.nn.LayerNorm(65)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    fused = LayerNormGELU(65, approximate="tanh")
    fused.load_state_dict(ln.state_dict(), strict=True)
    x = torch.randn(3, 4, 65)
    ref = F.gelu(F.layer_norm(x.double(), (65,), ln.weight.double(), ln.bias.double()),
                 approximate="tanh")
    assert_gate("module output", fused(x), F.gelu(ln(x), approximate="tanh"), ref)
    assert "approximate='tanh'" in repr(fused)


@pytest.mark.parametrize("bad,error,message", [
    (dict(x=torch.arange(12).view(3, 4)), TypeError, "x must be float32, float16 or bfloat16"),
    (dict(weight=torch.ones(4, device="meta")), RuntimeError, "all tensors must be on one device"),
    (dict(weight=torch.ones(5)), ValueError, r"weight has shape \(5,\), expected \(4,\)"),
    (dict(bias=torch.ones(2, 2)), ValueError, r"bias has shape \(2, 2\), expected \(4,\)"),
    (dict(x=torch.ones(3, 0)), ValueError, "no features to normalise"),
    (dict(eps=-1e-5), ValueError, "eps must be a finite number >= 0"),
    (dict(approximate="fast"), ValueError, "approximate must be 'none' or 'tanh'"),
])
def test_bad_input_raises_clear_error(bad, error, message):
    args = dict(x=torch.ones(3, 4), weight=torch.ones(4), bias=torch.ones(4), eps=1e-5,
                approximate="none")
    args.update(bad)
    with pytest.raises(error, match=message):
        layer_norm_gelu(**args)


def test_module_rejects_multi_dim_normalized_shape():
    with pytest.raises(ValueError, match="normalises the last dimension only"):
        LayerNormGELU((4, 8))


def test_norm_kernels_compile_for_sm90():
    # The interpreter checks what the kernels compute; this compiles every launch configuration
    # the launchers produce (all three norms) with ptxas for sm_90, so a GPU-only codegen error
    # fails CI too. A subprocess, since TRITON_INTERPRET=1 replaces the kernels here.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_norm_compile_check.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kernel configurations for sm_90" in done.stdout


# ---- GPU lane ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gpu_gate(approximate, dtype, n):
    nc.gate(case(approximate), (7, n), dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 768), (1, 768), (65537, 64), (4, 33, 768),
                                   (2, 3, 5, 4096), (300, 16384)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_shapes(shape, dtype):
    nc.gate(case(), shape, dtype, device="cuda")


@pytest.mark.gpu
def test_gpu_strided_constant_and_nan():
    for make_view, shape in [(lambda t: t.transpose(0, 1), (4096, 8)),
                             (lambda t: t[..., ::2], (8, 8192))]:
        nc.assert_same_as_contiguous(_cuda(case()), make_view, shape, torch.bfloat16)
    nc.constant_rows(_cuda(case()), torch.bfloat16, n=4096)
    nc.assert_nan_propagates(_cuda(case()), torch.float32, n=4096)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [768, 4096, 65537])
def test_gpu_torch_compile(n):
    nc.compiled_equals_eager(case(), (64, n), torch.bfloat16, device="cuda")


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    nc.cuda_graph_matches_eager(case(), (256, 4096), torch.bfloat16)


@pytest.mark.gpu
def test_gpu_backward_is_deterministic():
    nc.repeated_backward_is_bitwise_equal(case(), (4096, 1024), torch.bfloat16, repeats=50)


@pytest.mark.gpu
def test_gpu_past_2_31_elements():
    nc.rows_past_2_31_elements(case(), n=4096)


def _cuda(c: nc.NormCase) -> nc.NormCase:
    return nc.on_device(c, "cuda")
