"""Copies between layouts, rolls, gathers and accumulating scatters: their families, how they
fall back when unmeasured, and the copy a LayerNorm or softmax kernel makes of a permuted input
(tracing/layout.py `copy_kind`, `hidden_copies`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, ops_named, trace_fn

from gpushape.hardware import get_gpu
from gpushape.tracing.cost import op_cost
from gpushape.tracing.families import memory_family, op_family
from gpushape.tracing.flops.registry import op_work
from gpushape.tracing.layout import contiguous_like, copy_kind, hidden_copies


def _spec(**eff):
    """The H200 with these family efficiencies and no kernel floor: the tiny tensors here
    are priced by their bytes alone, the rates under test."""
    spec = get_gpu("h200")
    achievable = dataclasses.replace(spec.achievable, memory_efficiency=eff, kernel_floor_s=0.0)
    return spec.replace(achievable=achievable)


def _ops(fn, *shapes, name: str, train: bool = True, params: tuple = ()):
    inputs = tuple(meta(*s, dtype=torch.bfloat16, requires_grad=True) for s in shapes)
    return ops_named(trace_fn(fn, inputs, params, train=train), name)


def _window_partition(x):  # Swin: (B, H, W, C) -> (B * windows, 7, 7, C)
    b, h, w, c = x.shape
    x = x.view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5)
    return x.contiguous().view(-1, 7, 7, c)


def test_a_window_partition_is_a_permuted_copy_forward_and_backward():
    clones = _ops(_window_partition, (2, 14, 14, 96), name="clone")
    assert len(clones) == 2 and {r.phase for r in clones} == {"forward", "backward"}
    assert all(memory_family(r) == "permuted_copy" for r in clones)


def test_nchw_to_nhwc_is_a_transposed_copy():
    (clone,) = _ops(lambda x: x.permute(0, 2, 3, 1).contiguous(), (2, 96, 8, 8), name="clone")
    assert memory_family(clone) == "transposed_copy"
    (copy,) = _ops(
        lambda x: x.contiguous(memory_format=torch.channels_last), (2, 96, 8, 8), name="clone"
    )
    assert memory_family(copy) == "transposed_copy"


def test_plain_copies_keep_their_family():
    (clone,) = _ops(lambda x: x.clone() * 2, (8, 64), name="clone", train=False)
    assert memory_family(clone) == "elementwise"  # a pointwise-tagged op
    (cast,) = _ops(lambda x: x.float(), (8, 64), name="_to_copy", train=False)
    assert memory_family(cast) is None
    # a broadcast source reads little: not a layout copy, but a pointwise op on a broadcast
    # operand (priced as elementwise until its own rate is measured)
    (expand,) = _ops(lambda x: x.expand(4, 8, 64).contiguous(), (1, 8, 64), name="clone")
    assert memory_family(expand) == "elementwise_strided"
    assert op_family(expand, {"elementwise": 0.86}) == "elementwise"


def test_copy_kind_reads_the_destinations_innermost_rows():
    x = meta(2, 96, 8, 8)
    nhwc_view = x.permute(0, 2, 3, 1)
    from gpushape.tracing.recorder import tensor_meta

    src = tensor_meta(nhwc_view)
    assert copy_kind(src, contiguous_like(src)) == "transposed"
    rows = tensor_meta(meta(8, 128)[:, :64])  # a narrowed row: rows read whole
    assert copy_kind(rows, contiguous_like(rows)) == "permuted"
    same = tensor_meta(meta(8, 64))
    assert copy_kind(same, contiguous_like(same)) is None


def test_an_unmeasured_copy_kind_is_priced_as_before_a_measured_one_at_its_rate():
    (clone,) = _ops(lambda x: x.permute(0, 2, 3, 1).contiguous(), (2, 96, 8, 8), name="clone")
    assert op_family(clone, {"elementwise": 0.86}) == "elementwise"
    assert op_family(clone, {"elementwise": 0.86, "transposed_copy": 0.3}) == "transposed_copy"
    base = op_cost(clone, _spec(elementwise=0.86)).memory_s
    slow = op_cost(clone, _spec(elementwise=0.86, transposed_copy=0.43)).memory_s
    assert slow == pytest.approx(2 * base)


def _stem_layer_norm(shape=(2, 96, 8, 8)):
    """ConvNeXt's LayerNorm2d: NCHW in, LayerNorm over the channels of the permuted view."""
    fn = lambda x, w, b: F.layer_norm(x.permute(0, 2, 3, 1), (shape[1],), w, b).permute(0, 3, 1, 2)
    params = (torch.ones(shape[1], device="meta"), torch.zeros(shape[1], device="meta"))
    return {r.phase: r for r in _ops(fn, shape, name="native_layer_norm", params=params)}, {
        r.phase: r for r in _ops(fn, shape, name="native_layer_norm_backward", params=params)
    }


def test_a_layer_norm_of_a_permuted_input_pays_for_its_kernels_copy():
    fwd, bwd = _stem_layer_norm()
    (x,) = [t for t, kind in hidden_copies(fwd["forward"]) if kind == "transposed"]
    assert x.shape == (2, 8, 8, 96)
    assert [kind for _, kind in hidden_copies(bwd["backward"])] == ["transposed"]  # the input
    spec = _spec(norm=0.4, elementwise=0.8, transposed_copy=0.25)
    cost = op_cost(fwd["forward"], spec)
    expected = 2 * x.numel * x.itemsize / (spec.attainable_bandwidth_bytes_per_s() * 0.25)
    assert cost.layout_s == pytest.approx(expected)
    assert cost.kernel_time_s == pytest.approx(cost.memory_s + expected)
    assert cost.kernels == op_work(fwd["forward"]).kernels + 1
    unmeasured = op_cost(fwd["forward"], _spec(norm=0.4, elementwise=0.8))
    assert unmeasured.layout_s == pytest.approx(expected * 0.25 / 0.8)  # a clone's rate


def test_contiguous_norms_and_softmaxes_copy_nothing():
    (ln,) = _ops(lambda x: F.layer_norm(x, (96,)), (8, 96), name="native_layer_norm")
    assert hidden_copies(ln) == () and op_cost(ln, get_gpu("h200")).layout_s == 0
    (sm,) = _ops(lambda x: torch.softmax(x.transpose(0, 1), -1), (64, 8), name="_softmax")
    assert [kind for _, kind in hidden_copies(sm)] == ["transposed"]


def test_a_roll_over_two_dimensions_copies_twice():
    fn = lambda x: torch.roll(x, (-3, -3), (1, 2))
    rolls = _ops(fn, (2, 14, 14, 96), name="roll")
    assert len(rolls) == 2 and all(memory_family(r) == "roll" for r in rolls)
    work = op_work(rolls[0])
    assert work.kernels == 2 and work.reread_bytes == work.min_bytes
    (one,) = _ops(lambda x: torch.roll(x, 3, 1), (2, 14, 14, 96), name="roll", train=False)
    assert op_work(one).kernels == 1 and op_work(one).reread_bytes == 0


def test_embedding_forward_gathers_and_backward_scatters():
    ids = torch.zeros(4, 16, dtype=torch.long, device="meta")
    table = torch.empty(100, 32, device="meta", dtype=torch.bfloat16)
    ops = trace_fn(lambda ids, w: F.embedding(ids, w), (ids,), (table,), train=True).ops
    families = {r.name: memory_family(r) for r in ops if r.kind == "compute"}
    assert families["embedding"] == "gather"
    assert families["embedding_dense_backward"] == "scatter_add"
    (bwd,) = [r for r in ops if r.name == "embedding_dense_backward"]
    assert op_family(bwd, {"gather": 0.08}) == "gather"  # as priced before the split
    assert op_family(bwd, {"gather": 0.6, "scatter_add": 0.05}) == "scatter_add"


def test_an_indexed_reads_backward_is_an_accumulating_scatter():
    index = torch.zeros(49, dtype=torch.long, device="meta")
    table = torch.empty(13, 3, device="meta", dtype=torch.bfloat16)
    ops = trace_fn(lambda i, t: t[i] * 2, (index,), (table,), train=True).ops
    (put,) = [r for r in ops if r.name in ("index_put", "_index_put_impl_")]
    assert put.params.get("accumulate") and memory_family(put) == "scatter_add"
    (plain,) = _ops(
        lambda x: x.index_put(
            (torch.zeros(3, dtype=torch.long, device="meta"),),
            torch.ones(3, 8, device="meta", dtype=torch.bfloat16),
        ),
        (6, 8),
        name="index_put",
        train=False,
    )
    assert memory_family(plain) is None


def test_a_cache_append_of_a_permuted_view_is_its_own_family_falling_back_to_the_copy():
    """A key/value cache's first append (GPT-2's: a (B, T, H, D) view as (B, H, T, D) onto an
    empty tensor) runs PyTorch's cat kernel on a strided input: permuted_cat, priced as a
    permuted copy until measured. A cat of contiguous tensors is no copy family."""

    def append(x):
        heads = x.transpose(1, 2)
        return torch.cat([heads.new_empty(2, 3, 0, 8), heads], dim=-2)

    (cat,) = _ops(append, (2, 16, 3, 8), name="cat", train=False)
    assert memory_family(cat) == "permuted_cat"
    assert op_family(cat, {"permuted_copy": 0.3}) == "permuted_copy"
    assert op_family(cat, {"permuted_copy": 0.3, "permuted_cat": 0.18}) == "permuted_cat"
    assert op_family(cat, {"elementwise": 0.86}) is None  # no copy family measured: as before
    slow = op_cost(cat, _spec(permuted_copy=0.3, permuted_cat=0.15)).memory_s
    assert slow == pytest.approx(2 * op_cost(cat, _spec(permuted_copy=0.3)).memory_s)
    (plain,) = _ops(lambda a, b: torch.cat([a, b], dim=-1), (2, 8), (2, 8), name="cat", train=False)
    assert memory_family(plain) is None


def test_the_stack_of_an_unbinds_permuted_gradients_is_a_permuted_stack():
    """timm's attention splits one qkv projection with reshape, permute and unbind; autograd
    stacks dQ, dK and dV back, each laid out as the permuted view it was (B, N, H, D in memory,
    read as B, H, N, D): PyTorch's cat kernel over strided inputs, several of them (on an H100
    about a third of the copy rate, where a cache's lone append ran at a fifth): permuted_stack,
    priced as a lone append (permuted_cat), then as a permuted copy, until measured. A stack or
    cat of contiguous slices stays no copy family, and a transposed one is a transposed copy."""

    def split(x):
        q, k, v = x.reshape(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return q * k * v

    x = meta(2, 16, 96, dtype=torch.bfloat16, requires_grad=True)
    tr = trace_fn(split, (x,), train=True)
    (stack,) = ops_named(tr, "stack")
    assert stack.phase == "backward" and memory_family(stack) == "permuted_stack"
    assert op_family(stack, {"permuted_copy": 0.3}) == "permuted_copy"
    assert op_family(stack, {"permuted_copy": 0.3, "permuted_cat": 0.2}) == "permuted_cat"
    both = {"permuted_copy": 0.3, "permuted_cat": 0.2, "permuted_stack": 0.33}
    assert op_family(stack, both) == "permuted_stack"
    (plain,) = _ops(lambda a, b: torch.stack([a, b]), (2, 8), (2, 8), name="stack", train=False)
    assert memory_family(plain) is None
    (flipped,) = _ops(
        lambda a, b: torch.stack([a.t(), b.t()]), (8, 4), (8, 4), name="stack", train=False
    )
    assert memory_family(flipped) == "transposed_copy"


def _patch_embedding(x, w):  # ConvNeXt's and Swin's stem: a 4x4 patch conv, normed as NHWC
    return F.layer_norm(F.conv2d(x, w, stride=4).permute(0, 2, 3, 1), (96,))


PATCH_WEIGHT = (torch.empty(96, 3, 4, 4, dtype=torch.bfloat16, device="meta"),)


def test_a_convolutions_gradient_is_copied_to_its_inputs_layout():
    (bwd,) = _ops(
        _patch_embedding, (2, 3, 32, 32), name="convolution_backward", params=PATCH_WEIGHT
    )
    (dy,) = [t for t, kind in hidden_copies(bwd) if kind == "transposed"]
    assert dy.shape == (2, 96, 8, 8)  # NHWC-strided, copied to the NCHW image's layout
    spec = _spec(transposed_copy=0.25)
    expected = 2 * dy.numel * dy.itemsize / (spec.attainable_bandwidth_bytes_per_s() * 0.25)
    assert op_cost(bwd, spec).layout_s >= expected


def test_a_convolutions_gradient_in_its_inputs_layout_is_not_copied():
    w = PATCH_WEIGHT
    (nchw,) = _ops(lambda x, w: F.conv2d(x, w, stride=4), (2, 3, 32, 32),
                   name="convolution_backward", params=w)  # fmt: skip
    assert hidden_copies(nchw) == ()

    def channels_last(x, w):
        return F.conv2d(x.contiguous(memory_format=torch.channels_last), w, stride=4)

    (nhwc,) = _ops(channels_last, (2, 3, 32, 32), name="convolution_backward", params=w)
    assert hidden_copies(nhwc) == ()


def test_a_transposed_copy_into_nchw_has_its_own_family_falling_back_to_the_other_way():
    (clone,) = _ops(lambda x: x.permute(0, 3, 1, 2).contiguous(), (2, 8, 8, 96), name="clone")
    assert memory_family(clone) == "transposed_copy_nchw"
    assert op_family(clone, {"transposed_copy": 0.3}) == "transposed_copy"
    both = {"transposed_copy": 0.3, "transposed_copy_nchw": 0.15}
    assert op_family(clone, both) == "transposed_copy_nchw"
    (bwd,) = _ops(
        _patch_embedding, (2, 3, 32, 32), name="convolution_backward", params=PATCH_WEIGHT
    )
    slow, fast = op_cost(bwd, _spec(**both)), op_cost(bwd, _spec(transposed_copy=0.3))
    dy = bwd.inputs[0]
    extra = 2 * dy.numel * dy.itemsize / _spec().attainable_bandwidth_bytes_per_s()
    assert slow.layout_s - fast.layout_s == pytest.approx(extra * (1 / 0.15 - 1 / 0.3))


@pytest.mark.gpu
def test_on_cuda_the_stems_backward_copies_what_the_trace_says():
    """The copies `hidden_copies` prices are the ones CUDA runs: a 4x4 patch convolution normed
    as NHWC launches strided copies in its step (the norm's input, forward and backward, and
    the convolution's gradient), and none once the model is channels_last."""
    from gpushape.bench import kernel_times

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run `pytest -m gpu` on the GPU machine)")
    w = torch.randn(96, 3, 4, 4, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def copies(memory_format) -> int:
        x = torch.randn(16, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=memory_format)
        weight = w.detach().contiguous(memory_format=memory_format).requires_grad_()
        grad = torch.randn(16, 56, 56, 96, device="cuda", dtype=torch.bfloat16)

        def step():  # a contiguous output gradient: no copy of an expanded one in the count
            _patch_embedding(x, weight).backward(grad)

        kernels = kernel_times(step, calls=1, name_chars=300)
        return sum(1 for name, _ in kernels if "direct_copy" in name)

    assert copies(torch.contiguous_format) >= 3
    assert copies(torch.channels_last) == 0


def test_a_group_norm_of_a_channels_last_input_copies_it_to_nchw_both_ways():
    """CUDA's GroupNorm makes its input (and, backward, the gradient and the saved input)
    contiguous first, and writes its input gradient NCHW: PoolFormerV2's stage after a
    downsampling convolution of a channels_last input (its LayerNorm2d permutes). Whether the
    meta trace shows that copy as an op of its own depends on the torch release; either way
    the copy is priced once (a contiguous input has none to make)."""
    w = torch.ones(8, device="meta")
    fn = lambda x, w: F.group_norm(x.contiguous(memory_format=torch.channels_last), 1, w)
    x = meta(2, 8, 6, 6, dtype=torch.bfloat16, requires_grad=True)
    trace = trace_fn(fn, (x,), (w.to(torch.bfloat16),), train=True)
    fwd = ops_named(trace, "native_group_norm")
    bwd = ops_named(trace, "native_group_norm_backward")
    assert len(fwd) == len(bwd) == 1
    clones = [r for r in ops_named(trace, "clone") if r.phase == "forward"]
    seen = [r for r in clones if r.inputs[0].memory_format == "channels_last"]
    copied = [k for _, k in hidden_copies(fwd[0])]
    assert len(seen) + len(copied) == 1 and copied in ([], ["transposed"])
    assert bwd[0].outputs[0].memory_format == "contiguous"  # CUDA writes dX NCHW
    assert all(k == "transposed" for _, k in hidden_copies(bwd[0]))
    plain = ops_named(trace_fn(lambda x, w: F.group_norm(x, 1, w), (meta(2, 8, 6, 6),), (w,)),
                      "native_group_norm")  # fmt: skip
    assert hidden_copies(plain[0]) == ()


def test_a_group_norms_input_gradient_is_nchw_as_cuda_writes_it():
    """A meta kernel may return GroupNorm's input gradient with its channels_last gradient's
    strides (torch 2.14 did, in PoolFormerV2's early stages); CUDA writes it contiguous, so
    the ops after it (the residual's adds, the 1x1 convolutions' backward) run NCHW."""
    from gpushape.tracing.routing import cuda_output_layout

    func = torch.ops.aten.native_group_norm_backward.default
    dx = meta(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    dw, db = meta(8), meta(8)
    out = cuda_output_layout(func, (), (dx, dw, db))
    assert out[0].is_contiguous() and out[0].shape == dx.shape and out[1:] == (dw, db)
    nchw = (meta(2, 8, 6, 6), dw, db)
    assert cuda_output_layout(func, (), nchw) is nchw  # nothing to change
