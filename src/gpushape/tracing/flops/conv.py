"""Convolutions, forward and backward, with groups, stride, dilation, padding, transposition.

A convolution does one multiply-add per (output position, output channel, input channel of its
group, kernel tap): MACs = N x Cout x prod(out spatial) x (Cin / groups) x prod(kernel), and
FLOPs = 2 x MACs. Padding taps are counted (dense kernels multiply the zeros too), as the usual
ResNet-50 figure of 4.09 GMACs does. Stride and dilation enter through the output size. A bias
adds one FLOP per output element.

A transposed convolution scatters each input position through the kernel instead:
MACs = N x Cin x prod(in spatial) x (Cout / groups) x prod(kernel) (weight (Cin, Cout/g, *k)).

Backward (`aten.convolution_backward`, one op computing what `output_mask` asks):
- grad_input (dgrad) is a transposed convolution of grad_output with the weight: the same MACs
  as the forward;
- grad_weight (wgrad) correlates the input with grad_output: again the same MACs, since every
  weight element sums over N x prod(out spatial) products. With groups it is
  (Cout/g) x (Cin/g) x prod(kernel) weights per group, g groups: groups do NOT multiply it
  (torch.utils.flop_counter counts Cout x Cin x ... here, `groups` times too much; see
  tests/tracing/test_flop_counter_differences.py);
- grad_bias is a reduction of grad_output: one FLOP per element.

As implicit GEMMs (NHWC, per group): forward M = N x out positions, N = Cout/g,
K = Cin/g x taps; dgrad M = N x in positions, N = Cin/g, K = Cout/g x taps; wgrad M = Cout/g,
N = Cin/g x taps, K = N x out positions. Channels per group must meet the tensor-core alignment.

Depthwise and narrow grouped convolutions (fewer than DIRECT_BELOW input channels per group, as
in MobileNet, EfficientNet and ConvNeXt) are no GEMM: cuDNN runs them as direct kernels on CUDA
cores, each output a short dot product over taps, bound by moving the activations. They carry
no `Gemm` (no tile or wave model, no tensor cores): their FLOPs run at the CUDA-core rate and
their bytes at the measured rate of the `grouped_conv` memory family (tracing/families.py).
Priced as GEMMs they came out 4.9-6.7x slower than the H200 measured them.

A patch embedding (`patch_side`: stride equal to a square kernel, no padding: ViT's 16x16/16,
ConvNeXt's and Swin's 4x4/4) on fewer input channels than the tensor-core alignment carries its
patch side on its GEMMs: cuDNN runs those at a rate of their own, measured by patch size
(tracing/gemm_model.py), not at the 7x7 stride-2 stem's.

The convolution of s2d-stem's SpaceToDepthConv2d (a stem folded into 16 channels, stride 1)
runs cuDNN kernels the GEMM model prices several times too fast (narrow N, short K): its GEMMs
carry `rate_key` "s2d_stem@<folded side>", priced at the rate `gpushape probe` measured for
that convolution at the nearest side (forward and weight gradient, over the model's time for
them; "s2d_stem" itself at side 4, ResNet's 7x7/2, "s2d_stem@2" a 3x3/2 stem's); the folds are
priced as the copies they are.
"""

from __future__ import annotations

import math

from ..records import OpRecord
from .registry import Gemm, OpWork, io_bytes, packet, register_formula


def _channels(rec: OpRecord, x: str, w: str):
    """(N, Cin, Cout, groups, in spatial, taps) for a forward conv's input and weight shapes."""
    X, W = rec.input(x).shape, rec.input(w).shape
    groups = int(rec.params.get("groups", 1))
    transposed = bool(rec.params.get("transposed", False))
    cin = X[1]
    cout = W[1] * groups if transposed else W[0]
    return X[0], cin, cout, groups, math.prod(X[2:]), math.prod(W[2:]), transposed


def conv_macs(
    n: int, cin: int, cout: int, groups: int, in_pos: int, out_pos: int, taps: int, transposed: bool
) -> int:
    """Multiply-adds of one convolution (see the module docstring)."""
    if transposed:
        return n * cin * in_pos * (cout // groups) * taps
    return n * cout * out_pos * (cin // groups) * taps


DIRECT_BELOW = 8  # input channels per group under which a grouped convolution is direct
RGB = 3  # an image's channels, as s2d-stem folds them (`stem_stride`)


def is_direct(cin: int, groups: int) -> bool:
    """A grouped convolution cuDNN runs as a direct kernel, not an implicit GEMM."""
    return groups > 1 and cin // groups < DIRECT_BELOW


def direct_conv(rec: OpRecord) -> bool:
    """Whether the (forward or backward) convolution `rec` is a direct grouped one."""
    names = ("input", "weight") if "weight" in rec.input_names else rec.input_names[:2]
    try:
        _, cin, _, groups, *_ = _channels(rec, *names)
    except (KeyError, IndexError, ValueError):
        return False
    return is_direct(cin, groups)


def _align(cin: int, cout: int, groups: int) -> tuple[tuple[str, int], ...]:
    return (("Cin/groups", cin // groups), ("Cout/groups", cout // groups))


def patch_side(rec: OpRecord, weight: str) -> int:
    """The kernel side of a patch embedding (a square kernel whose stride is the kernel, no
    padding or dilation, not transposed: each input position read by one output); else 0."""
    kernel = tuple(rec.input(weight).shape[2:])
    if not kernel or len(set(kernel)) != 1 or kernel[0] < 2 or rec.params.get("transposed"):
        return 0
    stride, padding, dilation = (
        _per_dim(rec.params.get(name), len(kernel), default)
        for name, default in (("stride", 1), ("padding", 0), ("dilation", 1))
    )
    if stride != kernel or any(padding) or set(dilation) != {1}:
        return 0
    return int(kernel[0])


def embedding_side(rec: OpRecord) -> int:
    """The patch side of a convolution (forward or backward) that embeds an image's few
    channels (fewer than DIRECT_BELOW in, no groups: ViT's 16x16/16 on RGB, Swin's and
    ConvNeXt's 4x4/4); else 0. cuDNN's NCHW conversions of its 3-channel input run at a rate
    of their own (tracing/layout.py `conversion_family`)."""
    names = ("input", "weight") if "weight" in rec.input_names else rec.input_names[:2]
    try:
        _, cin, _, groups, *_ = _channels(rec, *names)
        side = patch_side(rec, names[1])
    except (KeyError, IndexError, ValueError):
        return 0
    return side if groups == 1 and cin < DIRECT_BELOW else 0


def stem_stride(rec: OpRecord) -> int:
    """The stride of a convolution (forward or backward) on an image's few channels (fewer
    than DIRECT_BELOW in, no groups) that is not a patch embedding: a stem (ResNet's 7x7/2,
    PoolFormer's 7x7/4); else 0. Its NCHW conversions run at a rate of their own
    (tracing/layout.py `conversion_family`). s2d-stem's stride-1 convolution over the folded
    image (`SpaceToDepthConv2d`) counts as the stem it computes: it converts the same output
    (64 x 112² for ResNet's, most of the bytes), which the H100 converted at under half the
    copy rate; its stride is read from the folded channels, an RGB image's 3 x s² aligned up
    (16 at stride 2, 48 at stride 4). Priced at the bottlenecks' rate instead, s2d-stem on
    ResNet-50-GN was predicted to save 0.36 ms where it saved 0.18
    (benchmarks/results/loops-h100-33)."""
    names = ("input", "weight") if "weight" in rec.input_names else rec.input_names[:2]
    try:
        _, cin, _, groups, *_ = _channels(rec, *names)
        if rec.module_type == "SpaceToDepthConv2d":  # s2d-stem's folded stem (docstring)
            return max(2, round(math.sqrt(cin / RGB)))
        if groups != 1 or cin >= DIRECT_BELOW or patch_side(rec, names[1]):
            return 0
        kernel = tuple(rec.input(names[1]).shape[2:])
    except (KeyError, IndexError, ValueError):
        return 0
    stride = _per_dim(rec.params.get("stride"), len(kernel), 1)
    return int(stride[0]) if kernel else 0


def _per_dim(value, dims: int, default: int) -> tuple[int, ...]:
    """A convolution's int[] argument per spatial dimension (one value: the same for all)."""
    values = tuple(value) if value else (default,)
    return values * dims if len(values) == 1 else values


S2D_STEM = "s2d_stem"  # the measured rate's key (tracing/families.py lists it)
S2D_STEM_SIDE = 4  # the folded kernel side S2D_STEM itself is measured at (ResNet's 7x7/2)
S2D_FOLD = "s2d_fold"  # the memory family of its input's fold (pad, pixel_unshuffle, pad)


def rate_key(rec: OpRecord) -> str:
    """The measured rate a convolution's GEMMs run at, where it is one of gpushape's own
    modules' (s2d-stem's SpaceToDepthConv2d: the stride-1 convolution over folded channels):
    "s2d_stem@<folded kernel side>", priced at the measured side nearest it."""
    if rec.module_type != "SpaceToDepthConv2d":
        return ""
    weight = rec.input("weight") if rec.has_input("weight") else rec.inputs[1]
    return f"{S2D_STEM}@{max(weight.shape[2:], default=S2D_STEM_SIDE)}"


def _gemms(rec: OpRecord, weight: str, cin: int, cout: int, groups: int):
    """A maker of the op's GEMMs, (m, n, k, flops) -> Gemm, carrying what the convolution
    says of all of them: alignment, tensor cores, patch side, measured rate."""
    patch, rate = patch_side(rec, weight), rate_key(rec)
    dims = max(len(rec.input(weight).shape) - 2, 1)
    strided = not patch and not rec.params.get("transposed")
    stride = max(_per_dim(rec.params.get("stride"), dims, 1)) if strided else 0

    def gemm(m: int, n: int, k: int, flops: int) -> Gemm:
        return Gemm(
            m=m,
            n=n,
            k=k,
            flops=flops,
            family="conv",
            batch=groups,
            align_dims=_align(cin, cout, groups),
            tensor_cores=cin // groups > 1,
            patch=patch,
            stride=stride,
            rate_key=rate,
        )

    return gemm


@register_formula(
    "aten.convolution",
    "aten._convolution",
    "aten.convolution_overrideable",
    "aten.cudnn_convolution",
    "aten.mkldnn_convolution",
    "aten._slow_conv2d_forward",
    "aten.thnn_conv2d",
)
def convolution(rec: OpRecord) -> OpWork:
    names = rec.input_names
    n, cin, cout, groups, in_pos, taps, transposed = _channels(rec, names[0], names[1])
    out = rec.outputs[0]
    out_pos = math.prod(out.shape[2:])
    macs = conv_macs(n, cin, cout, groups, in_pos, out_pos, taps, transposed)
    bias = out.numel if rec.has_input("bias") else 0
    if is_direct(cin, groups):
        return OpWork(flops=2 * macs + bias, min_bytes=io_bytes(rec))
    # one GEMM row per output position (a transposed conv runs as a dgrad kernel, the same way)
    make = _gemms(rec, names[1], cin, cout, groups)
    gemm = make(n * out_pos, cout // groups, cin // groups * taps, 2 * macs)
    return OpWork(flops=2 * macs + bias, min_bytes=io_bytes(rec), gemms=(gemm,))


BACKWARD_OPS = ("aten.convolution_backward", "aten.convolution_backward_overrideable")


@register_formula(*BACKWARD_OPS)
def convolution_backward(rec: OpRecord) -> OpWork:
    grad_out = rec.input("grad_output")
    n, cin, cout, groups, in_pos, taps, transposed = _channels(rec, "input", "weight")
    out_pos = math.prod(grad_out.shape[2:])
    macs = conv_macs(n, cin, cout, groups, in_pos, out_pos, taps, transposed)
    mask = tuple(rec.params.get("output_mask", (True, True, True)))
    gemms, flops, kernels, skip = [], 0, 0, []
    make = _gemms(rec, "weight", cin, cout, groups)
    if mask[0]:  # grad_input: one GEMM row per input position
        gemms.append(make(n * in_pos, cin // groups, cout // groups * taps, 2 * macs))
        flops, kernels = flops + 2 * macs, kernels + 1
    else:
        skip.append("weight")  # only the input gradient reads the weight
    if mask[1]:  # grad_weight: one GEMM row per weight row, K runs over batch x positions
        rows, cols, depth = (cin, cout, n * in_pos) if transposed else (cout, cin, n * out_pos)
        gemms.append(make(rows // groups, cols // groups * taps, depth, 2 * macs))
        flops, kernels = flops + 2 * macs, kernels + 1
    else:
        skip.append("input")  # only the weight gradient reads the input
    if len(mask) > 2 and mask[2]:  # grad_bias: sum of grad_output over N and positions
        flops, kernels = flops + grad_out.numel, kernels + 1
    if is_direct(cin, groups):  # direct kernels: the same FLOPs, no GEMM tiles
        gemms = []
    return OpWork(
        flops=flops, min_bytes=io_bytes(rec, skip=skip), gemms=tuple(gemms), kernels=max(kernels, 1)
    )


def bias_grad_pass(rec: OpRecord) -> tuple[int, int, int, bool] | None:
    """(bytes, rows, channels, channels_last) of the bias gradient a convolution's backward
    sums in a kernel of its own (`grad_output.sum` over batch and positions): grad_output read
    once more, which `io_bytes` does not count, summed from batch x positions rows into one
    value an output channel. Channels_last that kernel is a column sum, like a Linear's bias
    gradient; NCHW a per-channel sum (tracing/sums.py prices both). None: no bias gradient."""
    if packet(rec.op) not in BACKWARD_OPS:
        return None
    mask = tuple(rec.params.get("output_mask", (True, True, True)))
    if len(mask) < 3 or not mask[2]:
        return None
    grad_out = rec.input("grad_output")
    channels = max(int(grad_out.shape[1]), 1)
    return grad_out.nbytes, grad_out.numel // channels, channels, grad_out.channels_last
