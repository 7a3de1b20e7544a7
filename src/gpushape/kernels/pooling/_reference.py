"""Plain-PyTorch max_pool2d with int8 window positions: what CPU tensors run (unless
TRITON_INTERPRET=1) and what the Triton kernels are tested against.

Forward: PyTorch's own max_pool2d_with_indices (its tie and NaN rules, by construction), its
int64 flat index ih * W + iw turned into the tap (ih - oh*SH + PH) * KW + (iw - ow*SW + PW).
Backward: every output's gradient added at the input its tap names, in float32 (float64 for
float64), outputs in ascending order (as the kernel and PyTorch's CUDA kernels add them), then
rounded once to the input's dtype.
"""

from __future__ import annotations

import torch

from ._geometry import Pool2d, dense


def _window_origins(geom: Pool2d, oh: int, ow: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each window's top-left input position: h0 (OH, 1) and w0 (OW,), int64, padding < 0."""
    (sh, sw), (ph, pw) = geom.stride, geom.padding
    h0 = torch.arange(oh, device=device).mul_(sh).sub_(ph).view(oh, 1)
    w0 = torch.arange(ow, device=device).mul_(sw).sub_(pw)
    return h0, w0


def reference_forward(
    x: torch.Tensor, geom: Pool2d, is_channels_last: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, taps) for a 4-D x; both (N, C, OH, OW) in x's layout, taps int8."""
    kernel, stride, padding = geom.as_lists()
    y, flat = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding)
    width = x.shape[-1]
    h0, w0 = _window_origins(geom, y.shape[-2], y.shape[-1], x.device)
    taps = (flat.div(width, rounding_mode="floor") - h0) * kernel[1] + (flat % width - w0)
    return dense(y, is_channels_last), dense(taps.to(torch.int8), is_channels_last)


def reference_backward(
    dy: torch.Tensor,
    taps: torch.Tensor,
    input_hw: tuple[int, int],
    geom: Pool2d,
    is_channels_last: bool,
) -> torch.Tensor:
    """dx (N, C, H, W) in dy's dtype and the given layout."""
    n, c, oh, ow = taps.shape
    h, w = input_hw
    kw = geom.kernel[1]
    h0, w0 = _window_origins(geom, oh, ow, taps.device)
    taps = taps.long()
    flat = (h0 + taps.div(kw, rounding_mode="floor")) * w + (w0 + taps % kw)
    acc_dtype = torch.float64 if dy.dtype == torch.float64 else torch.float32
    acc = torch.zeros((n * c, h * w), dtype=acc_dtype, device=dy.device)
    acc.scatter_add_(1, flat.reshape(n * c, oh * ow), dy.to(acc_dtype).reshape(n * c, oh * ow))
    return dense(acc.view(n, c, h, w).to(dy.dtype), is_channels_last)
