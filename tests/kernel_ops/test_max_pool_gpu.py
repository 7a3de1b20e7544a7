"""max_pool2d on a CUDA GPU (`pytest -m gpu` on the GPU machine): ResNet-50's stem pool and
other shapes against PyTorch on CUDA (forward bit for bit, dx equal to PyTorch's float32 dx
rounded once), ties, NaN, -inf windows, torch.compile, CUDA graphs, determinism, > 2^31
elements."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels import MaxPool2d, max_pool2d

from ._max_pool_cases import (
    CF,
    CL,
    FORMATS,
    check_against_torch,
    make_input,
    run,
    special_values,
)

CUDA = torch.device("cuda")
GPU_CASES = [  # shape, dtype, layout, (kernel, stride, padding)
    ((256, 64, 112, 112), torch.bfloat16, CL, (3, 2, 1)),  # ResNet-50's stem, as trained
    ((64, 64, 112, 112), torch.bfloat16, CF, (3, 2, 1)),
    ((32, 64, 112, 112), torch.float16, CL, (3, 2, 1)),
    ((8, 256, 56, 56), torch.float32, CL, (2, 2, 0)),
    ((16, 3, 224, 224), torch.float32, CF, (3, 1, 1)),
    ((4, 2048, 7, 7), torch.bfloat16, CL, (7, 1, 3)),
    ((2, 17, 33, 65), torch.float32, CF, ((5, 2), (3, 1), (2, 1))),
    ((3, 200, 9, 10), torch.bfloat16, CL, (3, 2, 1)),
]


def _case_id(case) -> str:
    shape, dtype, fmt, pool = case
    layout = "cl" if fmt == CL else "nchw"
    return f"{'x'.join(map(str, shape))}-{str(dtype)[6:]}-{layout}-{pool}".replace(" ", "")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=_case_id)
def test_gpu_matches_torch(case):
    shape, dtype, fmt, pool = case
    x = make_input(shape, dtype, fmt, device=CUDA)
    check_against_torch(x, pool, gate=shape[0] * shape[1] < 2**15)  # the gate's float64 copies
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_ties_and_nan(dtype, fmt):
    ties = make_input((8, 64, 30, 31), dtype, fmt, ties=True, device=CUDA)
    check_against_torch(ties, (3, 2, 1), gate=False)
    special = special_values((4, 8, 13, 12), dtype, fmt).detach()
    special[-1, -1] = 1.0  # CUDA's channels_last kernel differs on all -inf windows: below
    check_against_torch(special.to(CUDA).requires_grad_(), (3, 1, 1), gate=False)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_gpu_all_minus_inf_window_routes_like_cpu(fmt):
    """A window of -inf only: the gradient goes to its first in-bounds tap, as PyTorch's CPU
    and CUDA NCHW kernels route it (CUDA's channels_last kernel sends it to pixel (0, 0))."""
    x = torch.full((1, 2, 5, 5), float("-inf")).contiguous(memory_format=fmt)
    dy = torch.randn(1, 2, 3, 3)
    _, dx_cpu = run(lambda t: F.max_pool2d(t, 3, 2, 1), x, dy)
    _, dx = run(lambda t: max_pool2d(t, 3, 2, 1), x.to(CUDA), dy.to(CUDA))
    assert torch.equal(dx.cpu(), dx_cpu)


@pytest.mark.gpu
def test_gpu_torch_compile_matches_eager():
    torch._dynamo.reset()
    x = make_input((16, 64, 56, 56), torch.bfloat16, CL, device=CUDA)
    dy = torch.randn(16, 64, 28, 28, device=CUDA).to(torch.bfloat16)
    compiled = torch.compile(MaxPool2d(3, 2, 1), fullgraph=True)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        y, dx = run(compiled, x, dy)
    y_eager, dx_eager = run(MaxPool2d(3, 2, 1), x, dy)
    assert torch.equal(y, y_eager) and torch.equal(dx, dx_eager)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_gpu_cuda_graph_replay(fmt):
    """Forward and backward captured in a CUDA graph; new inputs copied in; the replay equals
    eager on them."""
    static_x = make_input((32, 64, 56, 56), torch.bfloat16, fmt, device=CUDA)
    static_dy = torch.randn(32, 64, 28, 28, device=CUDA).to(torch.bfloat16)

    def step():
        static_x.grad = None
        y = max_pool2d(static_x, 3, 2, 1)
        y.backward(static_dy)
        return y, static_x.grad

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static, dx_static = step()
    fresh = make_input((32, 64, 56, 56), torch.bfloat16, fmt, device=CUDA)
    dy = torch.randn_like(static_dy)
    with torch.no_grad():
        static_x.copy_(fresh)
        static_dy.copy_(dy)
    graph.replay()
    y, dx = run(lambda t: max_pool2d(t, 3, 2, 1), fresh, dy)
    assert torch.equal(y_static, y) and torch.equal(dx_static, dx)


@pytest.mark.gpu
def test_gpu_repeated_backward_is_bitwise_equal():
    x = make_input((64, 64, 112, 112), torch.bfloat16, CL, device=CUDA)
    dy = torch.randn(64, 64, 56, 56, device=CUDA).to(torch.bfloat16)
    first = run(lambda t: max_pool2d(t, 3, 2, 1), x, dy)[1]
    for _ in range(10):
        assert torch.equal(first, run(lambda t: max_pool2d(t, 3, 2, 1), x, dy)[1])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_gpu_past_2_pow_31_elements(fmt):
    """9 x 64 x 2048 x 2048 bf16 (2.4e9 elements): the far end of x, y and dx is right."""
    x = torch.randn(9, 64, 2048, 2048, device=CUDA, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=fmt).requires_grad_()
    y = max_pool2d(x, 3, 2, 1)
    dy = torch.randn_like(y)
    y.backward(dy)
    tail = x.detach()[-1:].clone(memory_format=torch.preserve_format).requires_grad_()
    y_ref = F.max_pool2d(tail.float(), 3, 2, 1)
    y_ref.backward(dy[-1:].float())
    assert torch.equal(y[-1:].float(), y_ref)
    assert torch.equal(x.grad[-1:], tail.grad.to(torch.bfloat16))
    del x, y, dy
    torch.cuda.empty_cache()
