"""Is PyTorch's average-pool backward right for channels_last inputs on this device?

pytorch/pytorch#188344: the CUDA kernel for NHWC inputs left out the padding offset, so with
padding > 0 it returned wrong input gradients, silently (forward right, NCHW right, CPU right).
PoolFormer's and PoolFormerV2's token mixers pool with AvgPool2d(3, 1, 1,
count_include_pad=False): a rewrite that hands them channels_last tensors (channels-last;
fuse-group-norm, whose kernel keeps its input's layout where PyTorch's group norm returns NCHW)
then trains on wrong gradients. This compares the input gradient of each pooling (and of the
mixer, pool(y) - y) for y in NCHW and in channels_last, float32 and float64, at PoolFormer's
shapes; rounding gives 0 to 1e-7, the bug O(1).

    python benchmarks/kernels/check_avg_pool_nhwc.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

SHAPES = ((64, 512, 7, 7), (64, 320, 14, 14), (64, 64, 56, 56), (2, 4, 5, 5))
OPS = {
    "avg_pool2d(3, 1, 1, count_include_pad=False)": lambda t: F.avg_pool2d(
        t, 3, 1, 1, count_include_pad=False
    ),
    "avg_pool2d(3, 1, 1, count_include_pad=False) - y": lambda t: (
        F.avg_pool2d(t, 3, 1, 1, count_include_pad=False) - t
    ),
    "avg_pool2d(3, 1, 1)": lambda t: F.avg_pool2d(t, 3, 1, 1),
    "avg_pool2d(2, 2, 0)": lambda t: F.avg_pool2d(t, 2, 2, 0),
    # ResNet-D's shortcut (timm's avg_down): no padding, but partial windows on odd maps
    "avg_pool2d(2, 2, 0, ceil_mode, count_include_pad=False)": lambda t: F.avg_pool2d(
        t, 2, 2, 0, ceil_mode=True, count_include_pad=False
    ),
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    dev = parser.parse_args().device
    print(f"torch {torch.__version__} on {dev}")
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for shape in SHAPES:
            y = torch.randn(*shape, device=dev, dtype=dtype)
            for name, fn in OPS.items():
                grads = []
                for t in (y, y.contiguous(memory_format=torch.channels_last)):
                    t = t.detach().requires_grad_()
                    out = fn(t)
                    g = torch.randn(out.shape, device=dev, dtype=dtype,
                                    generator=torch.Generator(dev).manual_seed(1))  # fmt: skip
                    grads.append((out.detach(), torch.autograd.grad(out, t, g)[0]))
                (o1, g1), (o2, g2) = grads
                print(f"{str(dtype)[6:]:8} {shape!s:18} {name:56} forward {rel(o2, o1):.1e}"
                      f"  input gradient {rel(g2, g1):.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
