"""tc-align follows the chip's measured cliffs: the granularity comes from the GPUSpec, M does
not count, K and N and channels do, and the saving is the cost model's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.auditing import audit
from gpushape.auditing.finding import Severity
from gpushape.hardware import get_gpu

from .cases import build, meta
from .models import OneLinear


def _tc_align(model, inputs, gpu="h200", train=True):
    return audit(model, inputs, gpu=gpu, train=train, rules=["tc-align"]).findings


@pytest.mark.parametrize(("k", "fires"), [(4095, True), (4096, False), (4100, True), (4104, False)])
def test_the_cliff_is_at_8_elements_in_bf16(k, fires):
    """H200, bf16 GEMM: 4095 -> 148, 4096 -> 737, 4100 -> 211, 4104 -> 681 TFLOP/s."""
    findings = _tc_align(build(OneLinear, k, 4096), (meta(4096, k),))
    assert bool(findings) == fires
    if fires:
        (f,) = findings
        assert f.evidence["dim"] == "K" and f.evidence["padded_to"] % 8 == 0
        assert f.severity == Severity.HIGH and f.fix == "pad-channels"
        assert f.evidence["time_padded_s"] < f.evidence["time_as_is_s"]


def test_rows_do_not_count():
    """M = 127 tokens ran as fast as 128 on the H200: no finding, even in training (where
    the weight gradient's inner dimension is the token count: 127 x 64 is aligned)."""
    assert _tc_align(build(OneLinear, 1024, 1024), (meta(127, 64, 1024),)) == []
    assert _tc_align(build(OneLinear, 1024, 1024), (meta(127, 1024),), train=False) == []


def test_conv_channels_63_against_64():
    """3x3 conv, 63 input channels: 169 against 242 TFLOP/s with 64 on the H200."""
    conv63 = build(nn.Sequential, nn.Conv2d(63, 64, 3, padding=1))
    findings = _tc_align(
        conv63.to(memory_format=torch.channels_last), (meta(64, 63, 56, 56, channels_last=True),)
    )
    (f,) = findings
    assert (f.module, f.evidence["dim"], f.evidence["value"], f.evidence["padded_to"]) == (
        "0",
        "Cin/groups",
        63,
        64,
    )
    assert f.est_saving_s > 0
    conv64 = build(nn.Sequential, nn.Conv2d(64, 64, 3, padding=1))
    assert (
        _tc_align(
            conv64.to(memory_format=torch.channels_last),
            (meta(64, 64, 56, 56, channels_last=True),),
        )
        == []
    )


def test_granularity_comes_from_the_spec():
    """A chip calibrated to a 16-element granularity flags K = 4104; the datasheet's 8 does
    not. No rule holds its own alignment constant."""
    h200 = get_gpu("h200")
    coarse = h200.replace(tc_align_elems={**h200.tc_align_elems, "bf16": 16}, note="test")
    model, inputs = build(OneLinear, 4104, 4096), (meta(4096, 4104),)
    assert audit(model, inputs, gpu=h200, profile=None, rules=["tc-align"]).findings == []
    (f,) = audit(model, inputs, gpu=coarse, profile=None, rules=["tc-align"]).findings
    assert (f.evidence["alignment_elems"], f.evidence["padded_to"]) == (16, 4112)
