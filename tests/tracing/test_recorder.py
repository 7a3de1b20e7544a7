"""The recorder: attribution, phases, layouts, inputs, devices, and failures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, ops_named
from torch import nn

import gpushape
from gpushape.errors import GpushapeError
from gpushape.tracing import TensorSpec, TraceError


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)) + x)  # the add and relu belong to the block


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = x.mean(dim=(2, 3))  # functional code in the root
        return self.head(x.view(x.size(0), x.size(1)))  # Python reads shapes


def _meta_net() -> Net:
    with torch.device("meta"):
        return Net()


def test_forward_ops_carry_module_path_type_and_phase():
    t = gpushape.trace(_meta_net(), (meta(2, 3, 8, 8),))
    convs = ops_named(t, "convolution")
    assert [(op.module, op.module_type) for op in convs] == [
        ("stem", "Conv2d"),
        ("blocks.0.conv", "Conv2d"),
        ("blocks.1.conv", "Conv2d"),
    ]
    assert {op.module for op in ops_named(t, "relu")} == {"blocks.0", "blocks.1"}
    assert only(t, "mean").module == "" and only(t, "mean").module_type == "Net"
    assert all(op.phase == "forward" for op in t.ops)
    assert t.modules["blocks.1.bn"] == "BatchNorm2d" and t.modules[""] == "Net"
    assert t.model == "Net" and not t.train and t.device == "meta"


class _Rotary(nn.Module):
    """A function wrapped in a module at call time (transformers 5.25's kernel-hub wrappers
    do this for the rotary embedding): the model does not hold it."""

    def forward(self, x):
        return x * 2.0 + 1.0


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(_Rotary()(x))


def test_ops_of_a_module_built_during_forward_belong_to_its_caller():
    """Its ops are the caller's, as the profiler's module ranges and the module paths a user
    can name see them (a path "attn._Rotary" names nothing `get_submodule` finds)."""
    net = nn.Sequential()
    net.add_module("attn", _Attention())
    t = gpushape.trace(net, (meta(4, 8),), train=True)
    assert {op.module for op in ops_named(t, "mul")} == {"attn"}
    assert {op.module_type for op in ops_named(t, "add")} == {"_Attention"}
    assert all(op.module in t.modules for op in t.ops)


def test_backward_ops_belong_to_the_module_whose_forward_made_them():
    t = gpushape.trace(_meta_net(), (meta(2, 3, 8, 8),), train=True)
    assert t.backward_ops()
    for op in t.backward_ops():
        assert op.fwd_index is not None, op
        fwd = t.ops[op.fwd_index]
        assert fwd.phase == "forward" and op.module == fwd.module
    conv_bwd = [op for op in t.ops if op.name == "convolution_backward"]
    assert [op.module for op in conv_bwd] == ["blocks.1.conv", "blocks.0.conv", "stem"]
    bn_bwd = ops_named(t, "native_batch_norm_backward")
    assert {op.module_type for op in bn_bwd} == {"BatchNorm2d"}
    assert {t.ops[op.fwd_index].name for op in conv_bwd} == {"convolution"}


def test_train_mode_is_restored_and_grads_untouched():
    net = _meta_net().eval()
    t = gpushape.trace(net, (meta(2, 3, 8, 8),), train=True)
    bn = [op for op in t.ops if op.name == "native_batch_norm"]
    assert all(op.params["training"] for op in bn)  # traced in train mode
    assert not net.training and all(p.grad is None for p in net.parameters())
    t = gpushape.trace(net.train(), (meta(2, 3, 8, 8),))  # inference traces in eval mode
    assert not any(op.params["training"] for op in t.ops if op.name == "native_batch_norm")
    assert net.training


def test_real_weights_are_swapped_for_meta_stand_ins_not_copied():
    net = Net()
    before = {name: p.data_ptr() for name, p in net.named_parameters()}
    t_real = gpushape.trace(net, (meta(2, 3, 8, 8),), train=True)
    t_meta = gpushape.trace(_meta_net(), (meta(2, 3, 8, 8),), train=True)
    assert [op.op for op in t_real.ops] == [op.op for op in t_meta.ops]
    assert {name: p.data_ptr() for name, p in net.named_parameters()} == before
    assert all(p.device.type == "cpu" and p.grad is None for p in net.parameters())


def test_real_device_runs_for_real_and_records_the_same_ops():
    net = Net()
    t_cpu = gpushape.trace(net, (torch.randn(2, 3, 8, 8),), device="cpu")
    t_meta = gpushape.trace(net, (torch.randn(2, 3, 8, 8),))
    assert t_cpu.device == "cpu"
    assert [(o.op, o.module) for o in t_cpu.ops] == [(o.op, o.module) for o in t_meta.ops]


def test_inputs_as_specs_dicts_and_layouts_are_recorded():
    with torch.device("meta"):
        conv = nn.Conv2d(4, 8, 3)
    spec = TensorSpec((2, 4, 10, 10), torch.bfloat16, channels_last=True)
    rec = only(gpushape.trace(conv.to(torch.bfloat16), (spec,)), "convolution")
    x = rec.input("input")
    assert x.memory_format == "channels_last" and x.channels_last and x.strides == (400, 1, 40, 4)
    assert x.dtype == "bfloat16" and x.itemsize == 2
    assert rec.input("weight").memory_format == "contiguous"

    class Kw(nn.Module):
        def forward(self, a, *, scale):
            return a * scale

    t = gpushape.trace(Kw(), {"a": TensorSpec((3,)), "scale": 2.0})
    assert only(t, "mul").inputs[0].shape == (3,)


def test_inplace_ops_and_views():
    class M(nn.Module):
        def forward(self, x):
            y = x.transpose(1, 2)
            y.relu_()
            x[:, 0] = 1.0  # a view then an in-place copy into it
            return x.unsqueeze_(0)

    t = gpushape.trace(M(), (meta(2, 3, 4),))
    relu = only(t, "relu_")
    assert relu.inplace and relu.inputs[0].memory_format == "strided"
    kinds = {op.name: op.kind for op in t.ops}
    assert kinds["transpose"] == kinds["select"] == kinds["unsqueeze_"] == "view"
    assert kinds["copy_"] == "compute"


def test_a_custom_op_with_a_registered_fake_impl():
    @torch.library.custom_op("gpushape_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class M(nn.Module):
        def forward(self, x):
            return twice(x) + 1

    rec = only(gpushape.trace(M(), (meta(5, 6),)), "twice")
    assert rec.op == "gpushape_test.twice.default" and rec.outputs[0].shape == (5, 6)
    report = gpushape.cost(gpushape.trace(M(), (meta(5, 6),)), "h100")
    assert report.ops[rec.index].min_bytes == 2 * 30 * 4  # read once, written once


def test_a_model_needing_values_fails_on_meta_naming_op_and_module_and_runs_on_cpu():
    class Gate(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # data-dependent Python branch

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.gate = Gate()

        def forward(self, x):
            return self.gate(self.lin(x))

    with pytest.raises(TraceError) as info:
        gpushape.trace(M(), (TensorSpec((2, 4)),))
    message = str(info.value)
    assert "aten." in message and "module 'gate' (Gate)" in message
    assert "--device cpu" in message and "\n" not in message
    assert isinstance(info.value, GpushapeError)
    t = gpushape.trace(M(), (TensorSpec((2, 4)),), device="cpu")
    assert t.device == "cpu" and ops_named(t, "addmm")


def test_shapes_the_model_refuses_fail_on_meta_pointing_at_the_inputs_not_the_device():
    """An op's own shape check fails on every device: tracing on CPU would not help, so the
    message points at the inputs; the meta device's own failures still point at --device cpu."""
    with pytest.raises(TraceError) as info:
        gpushape.trace(nn.Linear(4, 4), (TensorSpec((2, 5)),))
    message = str(info.value)
    assert "aten.addmm" in message and "check the inputs" in message
    assert "--device cpu" not in message and "\n" not in message
    with pytest.raises(TraceError) as info:  # the model's own check of its input, in Python
        gpushape.trace(_Lambda(_three_channels), (TensorSpec((2, 4, 8, 8)),))
    assert "the model refuses these shapes" in str(info.value)
    with pytest.raises(TraceError) as info:  # a value read: the meta device's own limit
        gpushape.trace(_Lambda(lambda x: x * int(x[0, 0])), (TensorSpec((2, 4)),))
    assert "--device cpu" in str(info.value) and "check the inputs" not in str(info.value)
    with pytest.raises(TraceError) as info:  # no meta kernel
        gpushape.trace(_Lambda(torch.nonzero), (TensorSpec((2, 4)),))
    assert "--device cpu" in str(info.value)


def _three_channels(x):
    if x.shape[1] != 3:
        raise ValueError(f"expected 3 channels, got {x.shape[1]}")
    return x


class _Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_a_value_test_with_in_reads_as_absent_on_meta_and_runs_on_cpu():
    """`value in tensor` needs values meta tensors lack: on meta it reads False (libraries use
    it for warnings: transformers' padding check, which stopped DeBERTa-v2), on CPU it runs."""

    class WarnsOnPadding(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.seen: list[bool] = []

        def forward(self, ids, x):
            self.seen.append(0 in ids[:, [-1, 0]])
            return self.lin(x)

    model = WarnsOnPadding()
    ids = torch.zeros(2, 5, dtype=torch.long)
    x = torch.randn(2, 8)
    t = gpushape.trace(model, (ids, x))
    assert model.seen == [False] and ops_named(t, "addmm")
    gpushape.trace(model, (ids, x), device="cpu")
    assert model.seen[-1] is True  # real values: the zeros are there


def test_a_python_error_in_forward_names_the_module():
    class Bad(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Bad()

        def forward(self, x):
            return self.inner(x)

    with pytest.raises(TraceError, match=r"ValueError raised in module 'inner' \(Bad\)"):
        gpushape.trace(M(), (meta(2),))


def test_bad_arguments():
    with pytest.raises(GpushapeError, match=r"nn\.Module"):
        gpushape.trace(lambda x: x, (meta(2),))
    with pytest.raises(TraceError, match="meta device"):
        gpushape.trace(_meta_net(), (meta(2, 3, 8, 8),), device="cpu")
    with pytest.raises(TraceError, match="requires grad"):
        gpushape.trace(Net().requires_grad_(False), (meta(2, 3, 8, 8),), train=True)


@pytest.mark.parametrize("channels_last", [False, True])
def test_convolution_layout_on_meta_follows_cuda(channels_last):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    with torch.device("meta"):
        net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 1))
    net = net.to(memory_format=fmt)
    x = torch.empty(2, 3, 12, 12, device="meta").contiguous(memory_format=fmt)
    t = gpushape.trace(net, (x,), train=True)
    expected = "channels_last" if channels_last else "contiguous"
    for name in ("convolution", "native_batch_norm", "relu", "convolution_backward"):
        assert {op.outputs[0].memory_format for op in ops_named(t, name)} == {expected}, name
