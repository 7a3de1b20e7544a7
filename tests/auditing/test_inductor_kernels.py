"""The kernels of a compiled step (auditing/pricing/inductor_kernels.py): extern kernels kept,
what lies between them fused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpushape
from gpushape.auditing.modes import compiled_kernels
from gpushape.auditing.pricing.inductor_kernels import PER_UNIT, compiled_units

from .models import ManyOpsRmsNorm


class _Mlp(nn.Module):
    """Two GEMMs with `norm` between them."""

    def __init__(self, norm: nn.Module, width: int = 256):
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(width, width), nn.Linear(width, width), norm

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


def _units(model: nn.Module, *shape: int) -> tuple[int, int]:
    """(compiled units, eager kernels) of a bf16 training step."""
    x = torch.empty(*shape, device="meta", dtype=torch.bfloat16)
    model = model.to(device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(model, (x,), train=True)
    cost = gpushape.cost(trace, "h200-sxm")
    return compiled_units(trace, cost, channels_last_convs=False), cost.totals.kernels


def test_a_norm_written_as_many_ops_compiles_to_about_the_kernels_of_a_fused_one():
    many, many_eager = _units(_Mlp(ManyOpsRmsNorm(256)), 4096, 256)
    one, one_eager = _units(_Mlp(nn.LayerNorm(256)), 4096, 256)  # one aten op each way
    assert many_eager > one_eager + 5  # eager: each small op its own kernel
    assert abs(many - one) <= 2  # compiled: Inductor fuses them into the reductions'


def test_a_pointwise_run_between_two_gemms_is_one_kernel():
    chain = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Dropout(0.0), nn.Linear(256, 256))
    plain = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))
    with_chain, _ = _units(chain, 4096, 256)
    without, _ = _units(plain, 4096, 256)
    assert with_chain - without <= 2  # the forward's GELU run, the backward's GELU gradient


def test_a_training_batch_norm_counts_its_split_statistics_and_its_pass():
    conv = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.Conv2d(64, 64, 1))
    plain = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.Conv2d(64, 64, 1))
    x = (32, 64, 56, 56)
    with_bn, _ = _units(conv, *x)
    without, _ = _units(plain, *x)
    assert with_bn - without == 6  # forward 3, backward 3


def test_compiled_kernels_scale_the_units_by_the_measured_ratio():
    model = _Mlp(nn.LayerNorm(256)).to(device="meta", dtype=torch.bfloat16)
    x = torch.empty(4096, 256, device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(model, (x,), train=True)
    cost = gpushape.cost(trace, "h200-sxm")
    units = compiled_units(trace, cost, channels_last_convs=False)
    assert compiled_kernels(trace, cost) == round(PER_UNIT * units)
    assert 1.2 < PER_UNIT < 1.6  # what the six measured models span (1.30-1.51)


@pytest.mark.parametrize(
    ("name", "batch", "measured"),
    [("hf:gpt2", 8, 612), ("timm:swin_tiny_patch4_window7_224", None, 745)],
)
def test_library_models_compile_to_the_kernels_measured_on_the_h200(name, batch, measured):
    """`gpushape bench ... --vs compile` on the H200 (bench-h200/gpt2.json and
    loop-timm_swin_tiny_patch4_window7_224-compile.json): kernels of one compiled step."""
    pytest.importorskip("transformers" if name.startswith("hf:") else "timm")
    from gpushape.models import resolve_model

    r = resolve_model(name, batch=batch)
    trace = gpushape.trace(r.model, r.example_inputs, train=True)
    assert compiled_kernels(trace, gpushape.cost(trace, "h200-sxm")) == pytest.approx(
        measured, rel=0.1
    )
