"""benchmarks/kernels/probe_cudnn_fusion.py on the CPU: its table of ResNet-50's convolutions is
torchvision's ResNet-50, shape for shape and count for count, and its summary weights each
shape by its count."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
import probe_cudnn_fusion as probe


def test_the_shapes_are_resnet50s_convolutions():
    models = pytest.importorskip("torchvision.models")
    with torch.device("meta"):
        net = models.resnet50()
    seen: Counter = Counter()

    def record(conv, args, _out):
        x = args[0]
        k, s = conv.kernel_size[0], conv.stride[0]
        seen[(conv.in_channels, conv.out_channels, k, s, x.shape[-1])] += 1

    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(record)
    net(torch.empty(2, 3, 224, 224, device="meta"))
    table = Counter()
    for _name, cin, cout, k, stride, side, times, _after_bn in probe.SHAPES:
        table[(cin, cout, k, stride, side)] += times
    assert table == seen and sum(seen.values()) == 53


def test_the_summary_weights_each_shape_by_its_count():
    rows = [
        {"shape": "a", "times": 3, "torch us": 100.0, "torch + stats us": 150.0},
        {"shape": "b", "times": 1, "torch us": 50.0, "torch + stats us": 60.0, "genstats us": 55.0},
    ]
    total = probe.summary(rows)
    assert total["torch ms a step"] == pytest.approx(0.35)
    assert total["torch + stats ms a step"] == pytest.approx(0.51)
    assert total["genstats ms a step"] == pytest.approx(0.055) and total["genstats shapes"] == 1
    assert total["sbr+genstats shapes"] == 0
