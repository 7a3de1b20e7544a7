"""s2d-stem: a strided convolution on few input channels computed as a stride-1 convolution
over its input folded into the channels. Exact against nn.Conv2d in float64 (forward and every
gradient) over kernels, strides, paddings and odd sizes; close in bf16; refused where it cannot
fold; the swap keeps the Parameters (state_dict, optimizer) and undoes."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from gpushape.models.space_to_depth import SpaceToDepthConv2d, fold_input, fold_weight, why_not
from gpushape.transforms import optimize, revert

CONFIGS = [  # (kernel, stride, padding, in_channels, H, W, bias)
    (7, 2, 3, 3, 224, 224, False),  # ResNet's stem
    (7, 2, 3, 3, 33, 31, True),  # odd sides
    (3, 2, 1, 3, 16, 21, True),  # a 3x3/2 stem (EfficientNet, MobileNet)
    (5, 2, 2, 1, 9, 8, False),
    (4, 2, 1, 3, 17, 17, True),  # an even kernel
    (5, 3, 0, 2, 20, 23, True),  # stride 3, no padding
    (7, 2, 0, 3, 16, 16, False),  # the folded rows cut the last input row
    (3, 2, 3, 3, 8, 8, True),  # padding past the kernel's reach
]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref).abs().max().item() / ref.abs().max().item()


def _grads(conv: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    y = conv(x)
    grads = torch.autograd.grad(y, [x, *conv.parameters()], dy)
    return y.detach(), grads


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "k{}s{}p{}c{}_{}x{}_b{}".format(*c))
@pytest.mark.parametrize("channels_last", [False, True])
def test_equal_to_the_convolution_forward_and_every_gradient_in_float64(config, channels_last):
    k, s, p, c, h, w, bias = config
    torch.manual_seed(0)
    conv = nn.Conv2d(c, 6, k, stride=s, padding=p, bias=bias).double()
    x = torch.randn(2, c, h, w, dtype=torch.float64)
    if channels_last:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    module = SpaceToDepthConv2d(conv)
    dy = torch.randn_like(conv(x))
    want_y, want = _grads(conv, x, dy)
    got_y, got = _grads(module, x, dy)
    assert got_y.shape == want_y.shape
    torch.testing.assert_close(got_y, want_y, rtol=1e-12, atol=1e-12)
    for g, ref in zip(got, want):
        torch.testing.assert_close(g, ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("x_nhwc", [False, True])
@pytest.mark.parametrize("w_nhwc", [False, True])
def test_the_output_has_the_layout_the_convolution_would_give(x_nhwc, w_nhwc):
    """channels_last out where the input or the weight is, contiguous otherwise: an NCHW model
    stays NCHW downstream of its stem."""
    conv = nn.Conv2d(3, 8, 7, stride=2, padding=3)
    x = torch.randn(2, 3, 32, 32)
    if x_nhwc:
        x = x.to(memory_format=torch.channels_last)
    if w_nhwc:
        conv = conv.to(memory_format=torch.channels_last)
    want, got = conv(x), SpaceToDepthConv2d(conv)(x)
    for fmt in (torch.contiguous_format, torch.channels_last):
        assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt)
    assert got.is_contiguous(memory_format=torch.channels_last) == (x_nhwc or w_nhwc)


def test_bf16_within_the_rounding_of_the_convolution():
    """Both in bf16 against float64: the folded sums round no worse than cuDNN's / ATen's."""
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
    x = torch.randn(2, 3, 64, 64)
    ref_y, ref = _grads(conv.double(), x.double(), torch.ones(2, 16, 32, 32, dtype=torch.float64))
    conv = conv.to(torch.bfloat16)
    module = SpaceToDepthConv2d(conv)
    dy = torch.ones(2, 16, 32, 32, dtype=torch.bfloat16)
    errs = []
    for m in (conv, module):
        y, (dx, dw) = _grads(m, x.to(torch.bfloat16), dy)
        pairs = ((y, ref_y), (dx, ref[0]), (dw, ref[1]))
        errs.append([_rel(a, b) for a, b in pairs])
    for plain, folded in zip(*errs):
        assert folded <= max(2 * plain, 1e-2)


def test_the_folds_place_every_tap():
    """W'[o, c s^2 + i s + j, a, b] = w[o, c, s a + i, s b + j], zero past the kernel; the input
    folds likewise, channels padded with zeros, in the layout asked for."""
    w = torch.arange(2 * 3 * 7 * 7, dtype=torch.float64).reshape(2, 3, 7, 7) + 1
    f = fold_weight(w, 2, 16)
    assert f.shape == (2, 16, 4, 4) and not f[:, 12:].any()
    for c, i, j, a, b in itertools.product(range(3), range(2), range(2), range(4), range(4)):
        u, v = 2 * a + i, 2 * b + j
        want = w[:, c, u, v] if u < 7 and v < 7 else torch.zeros(2, dtype=w.dtype)
        assert torch.equal(f[:, 4 * c + 2 * i + j, a, b], want)
    x = torch.randn(1, 3, 10, 10)
    folded = fold_input(x, (7, 7), 2, (3, 3), 16)
    assert folded.shape == (1, 16, 8, 8) and not folded[:, 12:].any()
    assert folded.is_contiguous()  # the input's layout by default
    nhwc = fold_input(x, (7, 7), 2, (3, 3), 16, torch.channels_last)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and torch.equal(nhwc, folded)
    assert torch.equal(folded[0, 4 * 1 + 2 * 1 + 0, 2, 3], x[0, 1, 2 * 2 + 1 - 3, 2 * 3 + 0 - 3])


@pytest.mark.parametrize(
    "conv, reason",
    [
        (nn.Conv2d(4, 8, 3, stride=2, groups=2), "grouped"),
        (nn.Conv2d(3, 8, 3, stride=2, dilation=2), "dilated"),
        (nn.Conv2d(3, 8, 3, stride=2, padding=1, padding_mode="reflect"), "padding_mode"),
        (nn.Conv2d(3, 8, 3, stride=1, padding="same"), "padding='same'"),
        (nn.Conv2d(3, 8, 3, stride=1), "stride"),
        (nn.Conv2d(3, 8, 3, stride=(2, 1)), "stride"),
        (nn.Conv2d(3, 8, 4, stride=4), "patch"),
        (nn.Conv2d(8, 8, 7, stride=2), "input channels"),
        (nn.Conv1d(3, 8, 7, stride=2), "not exactly nn.Conv2d"),
    ],
)
def test_what_it_cannot_fold_is_refused_with_the_reason(conv, reason):
    assert reason in why_not(conv, 8)
    with pytest.raises(ValueError, match="SpaceToDepthConv2d: cannot take"):
        SpaceToDepthConv2d(conv)


def test_a_wrong_input_is_a_value_error():
    module = SpaceToDepthConv2d(nn.Conv2d(3, 8, 7, stride=2, padding=3))
    with pytest.raises(ValueError, match=r"expected \(N, 3, H, W\)"):
        module(torch.randn(2, 4, 16, 16))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.body = nn.Conv2d(8, 8, 3, stride=2, padding=1)  # aligned: left alone
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.bn(self.stem(x)))).mean((2, 3)))


def test_optimize_swaps_the_stem_keeps_its_parameters_and_reverts():
    torch.manual_seed(0)
    model = Net()
    weight = model.stem.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # made before the swap
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 32, 32)
    want = model(x).detach()
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=["s2d-stem"])
    assert [c.module for c in report.applied] == ["stem"]
    assert report.verified["s2d-stem"].passed
    assert type(model.stem) is SpaceToDepthConv2d and model.stem.weight is weight
    assert type(model.body) is nn.Conv2d
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in keys.items()
    }
    model(x).square().sum().backward()
    opt.step()  # the optimizer made before the swap trains the stem
    assert not torch.equal(model.stem.weight, keys["stem.weight"])
    restored = revert(model)
    assert type(restored.stem) is nn.Conv2d and restored.stem.weight is weight


def test_a_stem_with_hooks_is_refused():
    model = Net()
    model.stem.register_forward_hook(lambda *a: None)
    x = torch.randn(2, 3, 32, 32)
    model, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=["s2d-stem"])
    assert not report.applied and type(model.stem) is nn.Conv2d
    assert any("hooks" in r.reason for r in report.refused)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_on_the_gpu_in_bf16_eager_and_compiled(compiled):
    """ResNet's stem at batch 32 on cuDNN: the folded module's output and weight gradient as
    close to float64 as the plain convolution's (and the same under torch.compile)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False).cuda()
    x = torch.randn(32, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    dy = torch.randn(32, 64, 112, 112, device="cuda")
    ref_y, ref = _grads(conv.double(), x.double(), dy.double())
    conv = conv.to(torch.bfloat16, memory_format=torch.channels_last)
    module = SpaceToDepthConv2d(conv)
    run = torch.compile(module) if compiled else module
    errs = []
    for m in (conv, run):
        y, (_, dw) = _grads(m, x.to(torch.bfloat16), dy.to(torch.bfloat16))
        errs.append([_rel(a, b) for a, b in ((y, ref_y), (dw, ref[1]))])
    for plain, folded in zip(*errs):
        assert folded <= max(2 * plain, 1e-2)


class NoNorm(Net):
    """Net without its BatchNorm (whose fused kernel the CPU would interpret slowly)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.Identity()


def test_optimize_picks_it_from_the_finding_where_the_profile_measured_its_rates():
    """With the fold's and the folded convolution's rates in the profile, slow-stem prices a
    saving (in compile mode too) and optimize applies s2d-stem by itself; without them not."""
    import dataclasses

    from gpushape import audit
    from gpushape.hardware.profile import calibrated

    h200 = calibrated("h200")
    rates = {**h200.achievable.memory_efficiency, "s2d_stem": 0.148, "s2d_fold": 0.212}
    gpu = h200.replace(achievable=dataclasses.replace(h200.achievable, memory_efficiency=rates))
    x = torch.randn(32, 3, 224, 224)  # at 4 x 128² the priced fold outweighs the gain
    _, report = optimize(NoNorm(), (x,), gpu=gpu, dtype=torch.float32, mode="graph")
    assert "s2d-stem" in [c.transform for c in report.applied]
    assert report.predicted_saving_s["s2d-stem"] > 0
    compiled = audit(NoNorm(), (x,), gpu=gpu, train=True, mode="compile", dtype=torch.float32)
    assert next(f for f in compiled.findings if f.rule == "slow-stem").est_saving_s > 0
    _, report = optimize(NoNorm(), (x,), gpu="h200", dtype=torch.float32, mode="graph")
    assert "s2d-stem" not in [c.transform for c in report.applied]
