"""global_response_norm on a CUDA GPU (`pytest -m gpu` on the GPU machine): the numeric gate at
ConvNeXt-V2-Tiny's four GRN shapes (batch 8) and in every dtype and layout, the pixel-split
sums, torch.compile with Inductor, CUDA-graph capture and replay, a bitwise-deterministic
backward, parameters in another dtype than x, and more than 2^31 elements. CPU lane:
test_grn.py."""

from __future__ import annotations

import pytest
import torch

from gpushape.kernels import global_response_norm
from gpushape.kernels.grn import _launch

from ._grn_cases import LAYOUTS, gate, make_case, torch_grn
from ._numeric import outputs_and_grads

CUDA = torch.device("cuda")
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
EPS = 1e-6
# ConvNeXt-V2-Tiny's GRNs sit in each block's MLP (4 x dim channels, dims 96 ... 768), (H, W, C)
TINY_STAGES = [(56, 56, 384), (28, 28, 768), (14, 14, 1536), (7, 7, 3072)]
GATE_CASES = [  # (N, H, W, C) whatever the layout, dtype, layout
    *(((8, *s), BF16, "nhwc") for s in TINY_STAGES),  # as trained, at batch 8
    ((8, 28, 28, 768), FP32, "nhwc"),
    ((8, 14, 14, 1536), FP16, "nhwc"),
    ((8, 56, 56, 384), BF16, "nchw"),
    ((8, 28, 28, 768), BF16, "nchw-cl"),
    ((8, 7, 7, 3072), FP16, "nchw-cl"),
    ((4, 33, 35, 200), FP32, "nchw"),  # sizes off every tile
    ((3, 17, 19, 65), FP32, "nchw-cl"),
    ((5, 9, 11, 131), BF16, "nhwc"),
]


def _case_id(case) -> str:
    shape, dtype, layout = case
    return f"{'x'.join(map(str, shape))}-{str(dtype)[6:]}-{layout}"


def _grn(channels_last: bool):
    return lambda x, w, b: global_response_norm(x, w, b, EPS, channels_last)


def _run(fn, args, dy):
    """(y, dx, dw, db) of fn(*args) for the output gradient dy."""
    (y,), grads = outputs_and_grads(fn, args, [dy])
    return (y, *grads)


def _assert_equal(got, want, names=("y", "dx", "dw", "db"), strides=True) -> None:
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype and (not strides or a.stride() == b.stride()), name
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"


def _compiled_equals_eager(x, w, b, channels_last: bool) -> None:
    """fullgraph=True with Inductor: the custom op between two fused pointwise kernels (scalings
    by powers of two, exact) gives eager's y and gradients bit for bit."""
    torch._dynamo.reset()
    dy = torch.randn_like(x)

    def fn(x, w, b):
        return 2.0 * global_response_norm(0.5 * x, w, b, EPS, channels_last)

    compiled = torch.compile(fn, fullgraph=True)
    with torch._functorch.config.patch(enable_autograd_cache=False):
        got = _run(compiled, (x, w, b), dy)
    _assert_equal(got, _run(fn, (x, w, b), dy), strides=False)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---- the numeric gate -----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", GATE_CASES, ids=_case_id)
def test_gpu_gate(case):
    shape, dtype, layout = case
    channels_last, fmt = LAYOUTS[layout]
    x, w, b = make_case(*shape, dtype, layout, device=CUDA)
    assert channels_last or x.is_contiguous(memory_format=fmt)
    gate(x, w, b, channels_last)
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_pixel_slices(layout):
    """Few samples and channels, many pixels: the sums split the pixels over many programs,
    each writing its own partial sums, added in order (forward and backward)."""
    channels_last = LAYOUTS[layout][0]
    x, w, b = make_case(2, 250, 251, 40, FP32, layout, device=CUDA)
    v = _launch.view(_launch.dense(x.detach(), channels_last), channels_last)
    assert _launch.plan(False, v, x.dtype, x.device).splits > 8
    assert _launch.plan(True, v, x.dtype, x.device).splits > 8
    gate(x, w, b, channels_last)


# ---- torch.compile, CUDA graphs, determinism --------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_torch_compile_matches_eager(layout):
    """fullgraph=True with Inductor: the custom op between two fused pointwise kernels (scalings
    by powers of two, exact) gives eager's y and gradients bit for bit."""
    x, w, b = make_case(8, 28, 28, 768, BF16, layout, device=CUDA)
    _compiled_equals_eager(x, w, b, LAYOUTS[layout][0])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_cuda_graph_replay(layout):
    """Forward and backward (all three gradients) captured in a CUDA graph; new inputs,
    parameters and output gradient copied in; the replay equals eager on them bit for bit."""
    channels_last = LAYOUTS[layout][0]
    fn = _grn(channels_last)
    static = make_case(8, 28, 28, 768, BF16, layout, device=CUDA)
    static_dy = torch.randn_like(static[0]).detach()

    def step():
        y = fn(*static)
        return (y.detach(), *torch.autograd.grad(y, static, static_dy))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()  # held below, with static and static_dy: the graph's memory
    fresh = make_case(8, 28, 28, 768, BF16, layout, device=CUDA)
    dy = torch.randn_like(static_dy)
    with torch.no_grad():
        for s, f in zip(static, fresh):
            s.copy_(f)
        static_dy.copy_(dy)
    graph.replay()
    want = _run(fn, fresh, dy)
    torch.cuda.synchronize()
    _assert_equal(outs, want)
    graph.replay()  # again, on the same inputs: the same values
    torch.cuda.synchronize()
    _assert_equal(outs, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "shape", [(8, 56, 56, 384), (2, 250, 251, 40)], ids=["tiny-stage1", "pixel-split"]
)
def test_gpu_backward_is_bitwise_deterministic(shape, dtype):
    x, w, b = make_case(*shape, dtype, "nhwc", device=CUDA)
    dy = torch.randn_like(x)
    first = _run(_grn(True), (x, w, b), dy)
    for _ in range(20):
        _assert_equal(_run(_grn(True), (x, w, b), dy), first)


# ---- parameters in another dtype than x ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gpu_parameters_in_another_dtype(layout):
    """Autocast keeps a GRN's weight and bias in float32 while x is bf16. One shape, called with
    bf16, float32, bf16 and float32 parameters (values exact in bf16; the kernels compute in
    float32): each dtype's calls the same bit for bit, y and dx of the two dtypes within one
    bf16 unit, dw and db in each parameter's dtype, the float32 ones
    within a bf16 unit of the bf16 ones. (The launch plans must not mix up the parameters'
    dtypes: that would give garbage, not a unit.) Why not bit for bit: Triton lays the
    per-sample kernel out by its widest load, 8 bf16 weights a thread or 4 float32, so the
    channel mean of the norms is summed in another order and d = mean + eps can differ in its
    last float32 bit (on an H100, 0-29 of 1.2 M elements of y one unit apart)."""
    channels_last = LAYOUTS[layout][0]
    x, w, b = make_case(4, 14, 14, 1536, BF16, layout, device=CUDA)
    dy = torch.randn_like(x)
    runs = []
    for dtype in (BF16, FP32, BF16, FP32):
        wd, bd = (t.detach().to(dtype).requires_grad_() for t in (w, b))
        runs.append(_run(_grn(channels_last), (x, wd, bd), dy))
        assert runs[-1][2].dtype == runs[-1][3].dtype == dtype
    one_unit = dict(rtol=2**-7, atol=2**-7)
    for name, i in (("y", 0), ("dx", 1)):
        torch.testing.assert_close(
            runs[1][i].float(), runs[0][i].float(), **one_unit, msg=lambda m, n=name: f"{n}: {m}"
        )
    _assert_equal(runs[2], runs[0])
    _assert_equal(runs[3], runs[1])
    for name, i in (("dw", 2), ("db", 3)):
        torch.testing.assert_close(
            runs[0][i].float(), runs[1][i], rtol=2**-7, atol=0, msg=lambda m, n=name: f"{n}: {m}"
        )


# ---- torch.compile on dense inputs the kernels copy first ---------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["nhwc-in-cl-memory", "nchw-memory-as-nhwc"])
def test_gpu_torch_compile_on_other_dense_layouts(kind):
    """An (N, H, W, C) x that is dense but not contiguous (channels_last memory; an NCHW
    tensor permuted): the kernels read a contiguous copy, so y and dx come back contiguous.
    The custom ops' fake implementations must give those strides too, which Inductor trusts."""
    base = make_case(4, 14, 14, 96, BF16, "nhwc", device=CUDA)[0].detach()
    if kind == "nhwc-in-cl-memory":
        x = base.contiguous(memory_format=torch.channels_last)
    else:
        x = base.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    x.requires_grad_()
    w, b = (torch.randn(96, device=CUDA).to(BF16).requires_grad_() for _ in range(2))
    _compiled_equals_eager(x, w, b, True)


# ---- more than 2^31 elements --------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gpu_forward_backward_past_2_pow_31_elements(layout):
    """129 x 128 x 128 x 1024 bf16 (2^31 + 2^24 elements, 4.3 GB a tensor; the last sample lies
    wholly past 2^31): y and dx of every sample, dw and db, against timm's composition run in
    float32 a few samples at a time (about 20 GB of GPU memory in all)."""
    channels_last = LAYOUTS[layout][0]
    n, h, w, c = 129, 128, 128, 1024
    shape = (n, h, w, c) if channels_last else (n, c, h, w)
    x = torch.randn(shape, device=CUDA, dtype=BF16).requires_grad_()
    assert x.numel() > 2**31
    wt = torch.randn(c, device=CUDA).to(BF16).requires_grad_()
    bs = torch.randn(c, device=CUDA).to(BF16).requires_grad_()
    dy = torch.randn(shape, device=CUDA, dtype=BF16)
    y = global_response_norm(x, wt, bs, EPS, channels_last)
    dx, dw, db = torch.autograd.grad(y, (x, wt, bs), dy)
    y = y.detach()
    dw_ref = torch.zeros(c, device=CUDA, dtype=torch.float64)
    db_ref = torch.zeros_like(dw_ref)
    w32, b32 = (t.detach().float().requires_grad_() for t in (wt, bs))
    tol = dict(rtol=2**-7, atol=1e-3)  # one bf16 unit apart at most
    for start in range(0, n, 8):
        part = slice(start, start + 8)
        x32 = x.detach()[part].float().requires_grad_()
        y32 = torch_grn(x32, w32, b32, EPS, channels_last)
        dx32, dw32, db32 = torch.autograd.grad(y32, (x32, w32, b32), dy[part].float())
        torch.testing.assert_close(y[part].float(), y32.to(BF16).float(), **tol)
        torch.testing.assert_close(dx[part].float(), dx32.to(BF16).float(), **tol)
        dw_ref += dw32.double()
        db_ref += db32.double()
        del x32, y32, dx32
    for name, got, ref in (("dw", dw, dw_ref), ("db", db, db_ref)):
        scale = ref.abs().max().item()
        torch.testing.assert_close(
            got.double(), ref, rtol=2**-7, atol=1e-3 * scale, msg=lambda m, n=name: f"{n}: {m}"
        )
    del x, y, dy, dx
    torch.cuda.empty_cache()
