"""benchmarks/steps/conv_layers.py on the CPU: the calls it records, their output shapes, FLOPs
and minimum bytes, and a whole run's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "steps"))
from conv_layers import ConvCall, record_calls

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "steps" / "conv_layers.py"


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, stride=2, padding=3)
        self.a = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.b = nn.Conv2d(8, 8, 3, padding=1, groups=2)  # the same call as `a`

    def forward(self, x):
        return self.b(self.a(self.stem(x)))


def test_calls_are_recorded_in_order_with_their_geometry():
    calls = record_calls(_Net(), (torch.randn(2, 3, 17, 17),))
    assert [name for name, _ in calls] == ["stem", "a", "b"]
    stem, a, b = (c for _, c in calls)
    assert a == b and stem != a
    assert stem.stride == (2, 2) and stem.padding == (3, 3) and a.groups == 2


def test_output_shape_and_flops_match_a_real_convolution():
    call = ConvCall((2, 6, 11, 9), (4, 3, 3, 5), (2, 1), (1, 2), (1, 2), 2)
    x, w = torch.randn(call.input), torch.randn(call.weight)
    y = F.conv2d(x, w, None, call.stride, call.padding, call.dilation, call.groups)
    assert tuple(y.shape) == call.output
    n, k, ho, wo = call.output
    assert call.flops() == 2 * n * k * ho * wo * 3 * 3 * 5  # per output: Cin/groups x kh x kw
    nbytes = call.pass_bytes(2)
    assert nbytes["forward"] == 2 * (x.numel() + w.numel() + y.numel()) == nbytes["weight grad"]


def test_a_cpu_run_writes_every_distinct_call(tmp_path):
    out = tmp_path / "conv.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "resnet50", "--input", "1x3x64x64", "--device", "cpu",
         "--rounds", "1", "--repeats", "1", "--out", str(out)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    rows = json.loads(out.read_text())["results"]["rows"]
    assert sum(r["count"] for r in rows) == 53  # ResNet-50: the stem, 48 in blocks, 4 shortcuts
    first = [r for r in rows if r["modules"][0] == "conv1"]
    assert len(first) == 1 and "input grad" not in first[0]["passes"]  # reads the data
    assert all(set(r["passes"]) == {"forward", "input grad", "weight grad"}
               for r in rows if r is not first[0])  # fmt: skip
    assert rows == sorted(rows, key=lambda r: -r["step_s"])
