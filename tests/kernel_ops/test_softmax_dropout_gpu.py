"""softmax_dropout on a GPU (`pytest -m gpu`): dropout statistics over a million elements, the
longest rows, many rows, index arithmetic past 2**31 elements, CUDA-graph capture and replay,
and the memory held for backward."""

import pytest
import torch
import torch.nn.functional as F

from gpushape.kernels.attention._philox import keep_mask_reference
from gpushape.kernels.attention.softmax_dropout import (
    draw_seed,
    dropout_keep_mask,
    softmax_dropout,
    softmax_dropout_bwd,
    softmax_dropout_fwd,
)

from ._softmax_cases import (
    DTYPES,
    gate,
    keep_fraction_ok,
    randn,
)

# ---------------------------------------------------------------------------------------------
# GPU only: full-size statistics, longest rows, > 2^31 elements, CUDA graphs, memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("p", [0.0, 0.17, 0.5, 0.9])
def test_gpu_dropout_statistics_over_a_million(p):
    x = torch.randn(1024, 1536, device="cuda", dtype=torch.bfloat16)
    seed = draw_seed("cuda")
    y, _ = softmax_dropout_fwd(x, seed if p else None, p, 1.0, None, False)
    keep = y != 0
    assert abs(keep.double().mean().item() - (1 - p)) <= 0.01
    if p:
        keep_fraction_ok(keep, p)
        assert torch.equal(keep, dropout_keep_mask(seed, x.shape, p, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [16384, 16385, 32768])  # one-pass maximum, one past, two-pass
def test_gpu_gate_longest_rows(dtype, n):
    gate(randn(4, n, dtype=dtype), 0.17)


@pytest.mark.gpu
def test_gpu_many_rows():
    gate(randn(65537, 8, dtype=torch.bfloat16), 0.17)


@pytest.mark.gpu
def test_gpu_over_2_31_elements():
    rows, n = 2**17 + 3, 16384  # 2^31 + 49152 elements, 4.3 GB in bf16
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(n, device="cuda", dtype=torch.bfloat16).expand(rows, n)
    seed = draw_seed("cuda")
    y, stats = softmax_dropout_fwd(x, seed, 0.1, 1.0, None, False)
    dx = softmax_dropout_bwd(dy, x, stats, seed, 0.1, 1.0, None, False, 1.0)
    last = slice(rows - 3, rows)  # rows whose elements sit past 2^31
    keep = keep_mask_reference(int(seed), 3, n, 0.1, "cuda", first_row=rows - 3) / 0.9
    s = F.softmax(x[last].double(), dim=-1)
    g = dy[last].double() * keep
    torch.testing.assert_close(y[last].double(), s * keep, atol=1e-5, rtol=1e-2)
    dx_ref = s * (g - (s * g).sum(-1, keepdim=True))
    torch.testing.assert_close(dx[last].double(), dx_ref, atol=1e-5, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    x = torch.randn(64, 1000, device="cuda")
    dy = torch.randn_like(x)
    ops = (softmax_dropout_fwd, softmax_dropout_bwd)

    def step():
        seed = draw_seed("cuda")
        y, stats = ops[0](x, seed, 0.3, 0.5, None, True)
        return seed, y, ops[1](dy, x, stats, seed, 0.3, 0.5, None, True, 0.5)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile every kernel variant outside the capture
        step()
        softmax_dropout(x, 0.3)
    torch.cuda.current_stream().wait_stream(side)
    graph, public = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seed, y, dx = step()
    with torch.cuda.graph(public):
        y_public = softmax_dropout(x, 0.3)
    seeds = []
    for _ in range(2):
        graph.replay()
        public.replay()
        torch.cuda.synchronize()
        y_eager, stats = ops[0](x, seed.clone(), 0.3, 0.5, None, True)
        assert torch.equal(y, y_eager)
        assert torch.equal(dx, ops[1](dy, x, stats, seed.clone(), 0.3, 0.5, None, True, 0.5))
        kept = y_public != 0
        assert abs(kept.float().mean().item() - 0.7) < 0.02
        torch.testing.assert_close(y_public[kept], (F.softmax(x, -1) / 0.7)[kept])
        seeds.append(seed.item())
    assert seeds[0] != seeds[1]  # every replay draws a fresh seed from torch's generator


@pytest.mark.gpu
def test_gpu_memory_held_for_backward_at_most_half_of_eager():
    x = torch.randn(16384, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def held_bytes(fn):  # as the anchors measure it: peak during forward, input excluded
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = fn(x)
        del y
        return torch.cuda.max_memory_allocated() - base

    eager = held_bytes(lambda x: F.dropout(F.softmax(x, dim=-1), p=0.1))
    assert held_bytes(lambda x: softmax_dropout(x, 0.1)) <= 0.5 * eager
