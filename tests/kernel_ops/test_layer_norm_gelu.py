"""layer_norm_gelu against F.gelu(F.layer_norm(...)): the shared matrix (_norm_suite.NormSuite)
for the exact GELU, the tanh approximation on the paths where it differs, and what is particular
to this op: the bf16 fast normal CDF switch, the module, errors, float32 parameters, opcheck,
meta tensors, and an sm_90 compile of every norm kernel configuration.
CPU lane: TRITON_INTERPRET=1 on small shapes; GPU lane: `pytest -m gpu`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels.norms._common import norm_tuning
from gpushape.kernels.norms.layer_norm_gelu import LayerNormGELU, layer_norm_gelu

from . import _norm_cases as nc
from ._norm_suite import GPU_N, NormSuite
from ._numeric import assert_gate, gate_forward_backward


def case(approximate: str = "none", eps: float = 1e-5) -> nc.NormCase:
    return nc.NormCase(
        name=f"layer_norm_gelu[{approximate}]",
        ours=lambda x, w, b: layer_norm_gelu(x, w, b, eps, approximate),
        torch_fn=lambda x, w, b: F.gelu(
            F.layer_norm(x, x.shape[-1:], w, b, eps), approximate=approximate
        ),
        row_inputs=1,
        param_names=("weight", "bias"),
    )


class TestLayerNormGELU(NormSuite):
    case = case("none")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # fresh inputs in every check, reproducible from run to run


# ---- the tanh approximation: every place the activation enters ------------------------------
@pytest.mark.parametrize("n", [1, 65, 1023, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tanh_gate(interpret, dtype, n):
    nc.gate(case("tanh"), (7, n), dtype)


def test_tanh_looped_path_constant_rows_and_gradcheck(interpret):
    with norm_tuning(fwd_max_block_n=32, bwd_max_block_n=32, looped_block_n=32):
        nc.gate(case("tanh"), (3, 65), torch.float32)
    nc.gate(case("tanh"), (37, 1500), torch.bfloat16)  # persistent backward, many tiles
    nc.constant_rows(case("tanh"), torch.bfloat16)
    nc.gradcheck_float64(case("tanh"), (3, 7))


def test_bfloat16_with_erf_instead_of_the_fast_cdf(interpret):
    with norm_tuning(bf16_fast_gelu=False):
        nc.gate(case(), (7, 1023), torch.bfloat16)


def test_weight_only_and_bias_only(interpret):
    x, w, b = case().inputs((7, 65), torch.float32)
    gate_forward_backward(
        lambda x, w: layer_norm_gelu(x, w, None),
        lambda x, w: F.gelu(F.layer_norm(x, (65,), w, None)),
        (x, w),
        names=["x", "weight"],
    )
    gate_forward_backward(
        lambda x, b: layer_norm_gelu(x, None, b),
        lambda x, b: F.gelu(F.layer_norm(x, (65,), None, b)),
        (x, b),
        names=["x", "bias"],
    )


def test_float32_parameters_with_bfloat16_input(interpret):
    x, w, b = case().inputs((7, 129), torch.bfloat16, param_dtype=torch.float32)
    y = layer_norm_gelu(x, w, b)
    assert y.dtype == torch.bfloat16
    y.backward(torch.randn_like(y))
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    ref = F.gelu(F.layer_norm(x.double(), (129,), w.double(), b.double()))
    torch_same = F.gelu(F.layer_norm(x.float(), (129,), w, b)).to(torch.bfloat16)
    assert_gate("output", y, torch_same, ref)


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
    ref = F.gelu(
        F.layer_norm(x.double(), (65,), ln.weight.double(), ln.bias.double()), approximate="tanh"
    )
    assert_gate("module output", fused(x), F.gelu(ln(x), approximate="tanh"), ref)
    assert "approximate='tanh'" in repr(fused)


def test_module_rejects_multi_dim_normalized_shape():
    with pytest.raises(ValueError, match="normalises the last dimension only"):
        LayerNormGELU((4, 8))


@pytest.mark.parametrize(
    "bad,error,message",
    [
        (dict(x=torch.arange(12).view(3, 4)), TypeError, "x must be float32, float16 or bfloat16"),
        (
            dict(weight=torch.ones(4, device="meta")),
            RuntimeError,
            "all tensors must be on one device",
        ),
        (dict(weight=torch.ones(5)), ValueError, r"weight has shape \(5,\), expected \(4,\)"),
        (dict(bias=torch.ones(2, 2)), ValueError, r"bias has shape \(2, 2\), expected \(4,\)"),
        (dict(x=torch.ones(3, 0)), ValueError, "no features to normalise"),
        (dict(eps=-1e-5), ValueError, "eps must be a finite number >= 0"),
        (dict(approximate="fast"), ValueError, "approximate must be 'none' or 'tanh'"),
    ],
)
def test_bad_input_raises_clear_error(bad, error, message):
    args = dict(
        x=torch.ones(3, 4), weight=torch.ones(4), bias=torch.ones(4), eps=1e-5, approximate="none"
    )
    args.update(bad)
    with pytest.raises(error, match=message):
        layer_norm_gelu(**args)


def test_norm_kernels_compile_for_sm90():
    # The interpreter checks what the kernels compute; this compiles every launch configuration
    # the launchers produce (all three norms) with ptxas for sm_90, so a GPU-only codegen error
    # fails CI too. A subprocess, since TRITON_INTERPRET=1 replaces the kernels here.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_norm_compile_check.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kernel configurations for sm_90" in done.stdout


# ---- GPU lane: the tanh approximation (the exact GELU runs in TestLayerNormGELU) -------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", GPU_N)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_tanh_gate(dtype, n):
    nc.gate(case("tanh"), (7, n), dtype, device="cuda")


@pytest.mark.gpu
def test_gpu_bfloat16_fast_cdf_against_erf():
    # The fast normal CDF (bf16 default) and erf both pass the gate at the benchmark shape.
    nc.gate(case(), (4096, 4096), torch.bfloat16, device="cuda")
    with norm_tuning(bf16_fast_gelu=False):
        nc.gate(case(), (4096, 4096), torch.bfloat16, device="cuda")
