"""BatchNorm in training is a two-pass algorithm: its time counts the input read twice, while
min_bytes (and so intensity) stays the every-tensor-once lower bound."""

import torch
from torch import nn

import gpushape
from gpushape.hardware import get_gpu


def _bn_costs(train: bool):
    model = nn.BatchNorm2d(64).to(torch.bfloat16)
    x = torch.empty(32, 64, 56, 56, dtype=torch.bfloat16, device="meta")
    report = gpushape.cost(gpushape.trace(model, (x,), train=train), get_gpu("h100"))
    return {op.op.split(".")[1]: op for op in report.ops if op.min_bytes}, x.numel() * 2


def test_training_forward_and_backward_read_twice():
    gpu = get_gpu("h100")
    ops, x_bytes = _bn_costs(train=True)
    fwd = next(c for name, c in ops.items() if "batch_norm" in name and "backward" not in name)
    bwd = next(c for name, c in ops.items() if "batch_norm_backward" in name)
    bw = gpu.attainable_bandwidth_bytes_per_s()
    assert abs(fwd.memory_s - (fwd.min_bytes + x_bytes) / bw) < 1e-12
    assert abs(bwd.memory_s - (bwd.min_bytes + 2 * x_bytes) / bw) < 1e-12  # x and dy again
    assert fwd.intensity == fwd.flops / fwd.min_bytes


def test_inference_is_one_pass():
    gpu = get_gpu("h100")
    ops, _ = _bn_costs(train=False)
    (fwd,) = (c for name, c in ops.items() if "batch_norm" in name)
    assert abs(fwd.memory_s - fwd.min_bytes / gpu.attainable_bandwidth_bytes_per_s()) < 1e-12
