"""Memory layout: NCHW tensors, and the conversions cuDNN runs around an NCHW convolution.

cuDNN's tensor-core convolutions work in NHWC. A convolution runs NHWC when its input or its
weight is channels_last (cuDNN's own rule; the tracer gives a meta convolution's output the
layout CUDA would, `routing.cuda_output_layout`). Given NCHW tensors it converts them: the
input to NHWC and the output back before the forward; grad_output in and grad_input out for
the input gradient; input and grad_output again for the weight gradient. Each conversion is a
separate kernel that reads and writes its tensor once. The cost model adds their time to the
convolution's (`cost.op_cost`, at the profile's "nchw_conversion" efficiency), and the
nchw-conv rule counts them as what channels_last saves.
"""

from __future__ import annotations

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
