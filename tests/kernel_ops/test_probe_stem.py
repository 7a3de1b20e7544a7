"""benchmarks/kernels/probe_stem.py times what s2d-stem ships: for each of its default stems,
the variants it builds compute the stem's sums (float64: outputs and the weight's gradient)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
from probe_stem import STEMS, errors, variants


@pytest.mark.parametrize("spec", STEMS.split(","))
def test_every_variant_is_the_stem(spec):
    k, s, p, o = (int(v) for v in spec.split(":"))
    torch.manual_seed(0)
    conv = nn.Conv2d(3, o, k, stride=s, padding=p, bias=False).double()
    mods = variants(conv)
    assert [m.channels for m in list(mods.values())[1:]] == [12, 16]
    x = torch.randn(2, 3, 30, 34, dtype=torch.float64)
    for name, err in errors(mods, x).items():
        assert err["output_max_err"] < 1e-12 and err["weight_grad_max_err"] < 1e-12, name
