"""Memory layout: NCHW tensors, the conversions cuDNN runs around an NCHW convolution, and
copies between layouts.

cuDNN's tensor-core convolutions work in NHWC. A convolution runs NHWC when its input or its
weight is channels_last (cuDNN's own rule; the tracer gives a meta convolution's output the
layout CUDA would, `routing.cuda_output_layout`). Given NCHW tensors it converts them: the
input to NHWC and the output back before the forward; grad_output in and grad_input out for
the input gradient; input and grad_output again for the weight gradient. Each conversion is a
separate kernel that reads and writes its tensor once. The cost model adds their time to the
convolution's (`cost.op_cost`, at the profile's "nchw_conversion" efficiency), and the
nchw-conv rule counts them as what channels_last saves.

A copy between two layouts of one shape (`clone` of a permuted view, `.contiguous()`, a window
partition) reads its source in one of two ways (`copy_kind`): "permuted" when the rows of the
destination's innermost dimension lie whole in the source (Swin's window partition, an attention
head split: 96 or 64 contiguous values per row), "transposed" when they are gathered across the
source (NCHW to NHWC: every value of a row from another line of memory). Eager copy kernels run
the second far below the first; each has its memory family (`copies.COPY_FAMILIES`). Some
eager kernels make such a copy themselves (`hidden_copies`): PyTorch's CUDA LayerNorm and softmax
first make a non-contiguous input contiguous, a kernel the meta trace does not see (ConvNeXt's
and Swin's stem LayerNorm runs on the permuted NCHW output of the patch convolution), and a
convolution's backward copies its gradient to its input's layout (that stem's gradient comes
back with channels_last strides); the cost model adds its time to the op's (`cost.op_cost`, in
`OpCost.layout_s`).

A pointwise op vectorizes (16-byte loads and stores) only when every operand is laid out as its
output is; an operand broadcast along a dimension (DropPath's (B, 1, 1, 1) mask, a layer scale's
(1, C, 1, 1), a bias added across rows, RMSNorm's per-row scale) or viewed with other strides
sends TensorIterator to its indexed kernel, element by element (`strided_operand`), a memory
family of its own (`families.ELEMENTWISE_STRIDED`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .flops.conv import embedding_side, stem_stride
from .flops.registry import packet
from .records import OpRecord, TensorMeta

FORWARD = frozenset(
    {
        "aten.convolution",
        "aten._convolution",
        "aten.cudnn_convolution",
        "aten.convolution_overrideable",
    }
)
BACKWARD = frozenset({"aten.convolution_backward", "aten.convolution_backward_overrideable"})
COPY_OPS = frozenset({"aten.clone", "aten._to_copy", "aten.copy_"})
# Inputs PyTorch's CUDA kernels make contiguous before they run (`expect_contiguous`,
# `.contiguous()` in layer_norm_cuda, host_softmax and their backwards; GroupNorm's on every
# device but the CPU, as torch's own reference `_refs.native_group_norm` copies "to match the
# eager implementation": a meta trace does not always show that copy as an op of its own).
CONTIGUOUS_INPUTS = {
    "aten.native_group_norm": ("input",),
    "aten.native_group_norm_backward": ("grad_out", "input"),
    "aten.native_layer_norm": ("input",),
    "aten.native_layer_norm_backward": ("grad_out", "input"),
    "aten._softmax": ("self",),
    "aten._softmax_backward_data": ("grad_output", "output"),
    "aten._log_softmax": ("self",),
    "aten._log_softmax_backward_data": ("grad_output", "output"),
}


def channels_last_strides(t: TensorMeta) -> bool:
    """Whether PyTorch's `suggest_memory_format` would call `t` channels_last: the strides
    order C, W, H, N (ties from size-1 dimensions broken as PyTorch breaks them)."""
    if len(t.shape) != 4 or len(t.strides) != 4 or 0 in t.shape:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        stride, size = t.strides[d], t.shape[d]
        if stride < smallest or (d == 0 and smallest == t.strides[1]):
            return False
        smallest = stride * size if size > 1 else stride
    return True


def runs_nchw(rec: OpRecord) -> bool:
    """Whether `rec`'s first tensor is 4-D NCHW where the layouts differ (C > 1, H x W > 1):
    BatchNorm and pooling then run their NCHW kernels (`families.NCHW_VARIANTS`)."""
    x = rec.inputs[0] if rec.inputs else None
    return (
        x is not None
        and len(x.shape) == 4
        and x.memory_format == "contiguous"
        and x.shape[1] > 1
        and x.shape[2] * x.shape[3] > 1
    )


def is_conv(rec: OpRecord) -> bool:
    """A 2-D convolution, forward or backward."""
    return packet(rec.op) in FORWARD | BACKWARD


def runs_nhwc(rec: OpRecord) -> bool:
    """Whether convolution `rec` (forward or backward) runs in channels_last."""
    if packet(rec.op) in BACKWARD:  # (grad_output, input, weight)
        x, w = rec.inputs[1], rec.inputs[2]
    else:
        x = rec.inputs[0]
        w = rec.input("weight") if rec.has_input("weight") else rec.inputs[1]
    return x.channels_last or channels_last_strides(x) or channels_last_strides(w)


def nchw_conversion_bytes(
    x_bytes: int, y_bytes: int, *, grad_input: bool, grad_weight: bool
) -> int:
    """Bytes the conversions move around one NCHW convolution with input of `x_bytes` and
    output of `y_bytes`: forward 2 (x + y); the input gradient 2 (dy + dx); the weight gradient
    2 (x + dy)."""
    per_pass = 2 * (x_bytes + y_bytes)
    return per_pass * (1 + int(grad_input) + int(grad_weight))


def conversion_passes(rec: OpRecord) -> int:
    """How many (read one tensor in, write one out) conversion pairs convolution `rec` needs
    when it runs NCHW: 1 for a forward, one per gradient a backward computes; 0 for any other
    op or an NHWC convolution. Whether it runs on tensor cores, which decides whether cuDNN
    converts at all, is the cost model's to say."""
    if not is_conv(rec) or len(rec.inputs[0].shape) != 4 or runs_nhwc(rec):
        return 0
    if packet(rec.op) in FORWARD:
        return 1
    mask = tuple(rec.params.get("output_mask", (True, True, False)))
    return int(bool(mask[0])) + int(len(mask) > 1 and bool(mask[1]))


CONVERSION = "nchw_conversion"  # the efficiency profile key (probe/convs.py)
STEM_CONVERSION = CONVERSION + "_stem"  # a stem's, "@<stride>" (probe/convs.py)
STEM_STRIDE = 2  # the stride STEM_CONVERSION itself is measured at


def conversion_family(rec: OpRecord, measured: Mapping[str, float]) -> str:
    """The efficiency key convolution `rec`'s conversions are priced at: a patch embedding's
    (`flops.conv.embedding_side`) at the measured "nchw_conversion@<side>" nearest its side by
    ratio (converting a 3-channel image ran at 0.16 of the copy rate for ViT's 16x16 patches
    on an H200, 0.57 for 4x4 ones, against 1.0 for ResNet's bottlenecks); a stem's
    (`flops.conv.stem_stride`) at the measured "nchw_conversion_stem" ("@<stride>") nearest
    its stride; any other, or one whose kind was not measured, at "nchw_conversion"."""
    from .families import nearest_size  # it imports this module

    side = embedding_side(rec)
    if side:
        sides = {key: v for key, v in measured.items() if key.startswith(CONVERSION + "@")}
        return nearest_size(CONVERSION, sides, side, side) if sides else CONVERSION
    stride = stem_stride(rec)
    stems = {key: v for key, v in measured.items() if key.partition("@")[0] == STEM_CONVERSION}
    if stride and stems:
        return nearest_size(STEM_CONVERSION, stems, stride, STEM_STRIDE)
    return CONVERSION


def conversion_bytes_of(rec: OpRecord) -> int:
    """The conversions' bytes of one convolution record (`nchw_conversion_bytes`; 0 when it
    converts nothing). A backward reads grad_output, a forward writes the output: both are
    the output-sized tensor."""
    passes = conversion_passes(rec)
    if not passes:
        return 0
    x = rec.inputs[0 if packet(rec.op) in FORWARD else 1].nbytes
    y = rec.outputs[0].nbytes if packet(rec.op) in FORWARD else rec.inputs[0].nbytes
    return passes * 2 * (x + y)


def contiguous_like(t: TensorMeta) -> TensorMeta:
    """`t` as `.contiguous()` would lay it out."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    return TensorMeta(
        shape=t.shape,
        dtype=t.dtype,
        strides=tuple(reversed(strides)),
        memory_format="contiguous",
        itemsize=t.itemsize,
    )


def copy_kind(src: TensorMeta, dst: TensorMeta) -> str | None:
    """How a copy of `src` into `dst` reads (module docstring): "permuted", "transposed", or
    None for a copy between alike layouts (or of a broadcast source, or shapes that differ)."""
    if src.shape != dst.shape or len(src.strides) != len(src.shape):
        return None
    if len(dst.strides) != len(dst.shape):
        return None
    dims = [d for d, size in enumerate(src.shape) if size > 1]
    if not dims or any(src.strides[d] == 0 for d in dims):
        return None
    if all(src.strides[d] == dst.strides[d] for d in dims):
        return None
    inner = min(dims, key=lambda d: dst.strides[d])
    return "permuted" if src.strides[inner] == 1 else "transposed"


def copy_op_kind(rec: OpRecord) -> str | None:
    """`copy_kind` of a copy op (clone, _to_copy, copy_, and a cat of one non-empty tensor:
    a key/value cache's first append), and of a cat or stack of several whose inputs read
    unlike their slices of the output ("permuted" where any input is read so: the backward of
    `qkv.unbind(0)` stacks dQ, dK and dV laid out as the permuted views they were, as timm's
    attention makes them); None for any other op."""
    op = packet(rec.op)
    if op in ("aten.cat", "aten.stack") and rec.outputs:
        full = [t for t in rec.inputs if t.numel]
        if op == "aten.cat" and len(full) == 1:
            return copy_kind(full[0], rec.outputs[0])
        return _joined_kind(full, rec.outputs[0], rec.params.get("dim", 0), op == "aten.stack")
    if op not in COPY_OPS or not rec.inputs:
        return None
    if op == "aten.copy_":  # copy_(self, src): self is the destination
        return copy_kind(rec.inputs[1], rec.inputs[0]) if len(rec.inputs) > 1 else None
    return copy_kind(rec.inputs[0], rec.outputs[0]) if rec.outputs else None


def _joined_kind(parts: list[TensorMeta], out: TensorMeta, dim, stacked: bool) -> str | None:
    """How a cat (or stack) reads its inputs into their slices of `out`: "permuted" where any
    input's dimensions lie in memory in another order than its slice's and its innermost row
    (the slice's) is contiguous, else "transposed" where any lies otherwise, else None. A
    slice is strided by `out`'s strides (less the stacked dimension), so the order of the
    strides, not their values, tells a plain copy."""
    if not isinstance(dim, int) or len(out.strides) != len(out.shape):
        return None
    dim %= len(out.shape)
    strides = out.strides[:dim] + out.strides[dim + 1 :] if stacked else out.strides
    kinds = set()
    for t in parts:
        if len(t.shape) != len(strides) or len(t.strides) != len(t.shape):
            continue
        dims = [d for d, size in enumerate(t.shape) if size > 1]
        if not dims or any(t.strides[d] == 0 for d in dims):
            continue
        if sorted(dims, key=lambda d: -t.strides[d]) == sorted(dims, key=lambda d: -strides[d]):
            continue
        inner = min(dims, key=lambda d: strides[d])
        kinds.add("permuted" if t.strides[inner] == 1 else "transposed")
    return next((k for k in ("permuted", "transposed") if k in kinds), None)


def nhwc_view_of_nchw(t: TensorMeta) -> bool:
    """Whether 4-D `t` is `x.permute(0, 2, 3, 1)` of a contiguous NCHW `x` (its shape N, H, W,
    C): what a LayerNorm over a convolution's channels reads, contiguous once `x` is
    channels_last (ConvNeXt's and Swin's stems)."""
    if len(t.shape) != 4 or len(t.strides) != 4:
        return False
    _, h, w, c = t.shape
    want = (c * h * w, w, 1, h * w)
    return (
        c > 1
        and h * w > 1
        and all(
            size == 1 or got == exp for size, got, exp in zip(t.shape, t.strides, want, strict=True)
        )
    )


def channels_last_like(t: TensorMeta) -> TensorMeta:
    """4-D `t` as `.contiguous(memory_format=torch.channels_last)` would lay it out."""
    _, c, h, w = (max(int(n), 1) for n in t.shape)
    return TensorMeta(
        shape=t.shape,
        dtype=t.dtype,
        strides=(h * w * c, 1, w * c, c),
        memory_format="channels_last",
        itemsize=t.itemsize,
    )


def hidden_copies(rec: OpRecord) -> tuple[tuple[TensorMeta, str], ...]:
    """(tensor, copy kind) for every input `rec`'s CUDA kernel first copies: to contiguous
    (`CONTIGUOUS_INPUTS`), and a 2-D convolution's gradient to its input's layout (PyTorch's
    cuDNN backward starts with `grad_output.to(input.suggest_memory_format())`: a patch
    embedding whose output was permuted to NHWC, ConvNeXt's, Swin's and ViT's, gets its
    gradient back with channels_last strides, copied to NCHW before cuDNN converts it)."""
    copies = []
    for name in CONTIGUOUS_INPUTS.get(packet(rec.op), ()):
        if rec.has_input(name):
            t = rec.input(name)
            kind = copy_kind(t, contiguous_like(t))
            if kind is not None:
                copies.append((t, kind))
    if packet(rec.op) in BACKWARD and len(rec.inputs) >= 2 and len(rec.inputs[0].shape) == 4:
        dy, x = rec.inputs[0], rec.inputs[1]
        nhwc = x.channels_last or channels_last_strides(x)
        kind = copy_kind(dy, channels_last_like(dy) if nhwc else contiguous_like(dy))
        if kind is not None:
            copies.append((dy, kind))
    return tuple(copies)


def strided_operand(rec: OpRecord) -> bool:
    """Whether a pointwise op reads a floating operand of more than one element laid out
    unlike its output: broadcast (another shape) or other strides over its dimensions of
    size > 1 (see the module docstring)."""
    if not rec.outputs:
        return False
    out = rec.outputs[0]
    for t in rec.inputs:
        if not t.is_floating or t.numel <= 1 or t.same_as is not None:
            continue
        if tuple(t.shape) != tuple(out.shape):
            return True
        if any(a != b for n, a, b in zip(out.shape, t.strides, out.strides) if n > 1):
            return True
    return False
