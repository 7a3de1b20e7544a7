"""FusedQKV against three nn.Linear layers plus view/transpose: outputs and every original
parameter's gradient (numeric gate), no copies, state_dict compatibility, errors, compile, and
on the GPU the kernel sequence between the GEMM and scaled_dot_product_attention."""

import io
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from gpushape.kernels.attention.fused_qkv import FusedQKV

from ._numeric import assert_gate

DEV = "cuda" if torch.cuda.is_available() else "cpu"


class ThreeLinears(nn.Module):
    """The baseline: separate q/k/v projections, heads split with view + transpose."""

    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=True, names=None):
        super().__init__()
        self.head_dim, self.names = embed_dim // num_heads, names or ("q_proj", "k_proj", "v_proj")
        outs = (
            num_heads * self.head_dim,
            num_kv_heads * self.head_dim,
            num_kv_heads * self.head_dim,
        )
        for name, out in zip(self.names, outs):
            setattr(self, name, nn.Linear(embed_dim, out, bias=bias))

    def layers(self):
        return [getattr(self, name) for name in self.names]

    def forward(self, x):
        b, t, _ = x.shape
        return tuple(
            layer(x).view(b, t, -1, self.head_dim).transpose(1, 2) for layer in self.layers()
        )


def grads(module, x, outs, grad_outs):
    """Gradients of x and of every parameter, in module.parameters() order."""
    return torch.autograd.grad(outs, [x, *module.parameters()], grad_outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_three_linears(dtype, heads, kv_heads, bias):
    torch.manual_seed(0)
    ref = ThreeLinears(64, heads, kv_heads, bias).to(DEV, torch.float64)
    base = ThreeLinears(64, heads, kv_heads, bias).to(DEV, dtype)
    base.load_state_dict(ref.state_dict())
    fused = FusedQKV.from_linears(*base.layers(), heads, kv_heads)
    for train in (True, False):
        fused.train(train)
        x = torch.randn(3, 7, 64, device=DEV, dtype=torch.float64, requires_grad=True)
        outs_ref = ref(x)
        grad_outs = [torch.randn_like(o) for o in outs_ref]
        xs = x.detach().to(dtype).requires_grad_()
        outs_fused, outs_base = fused(xs), base(xs)
        for name, o, t, r in zip("qkv", outs_fused, outs_base, outs_ref):
            assert o.shape == r.shape
            assert_gate(name, o, t, r)
        low = [g.to(dtype) for g in grad_outs]
        g_ref = grads(ref, x, outs_ref, grad_outs)
        g_base = grads(base, xs, outs_base, low)
        g_fused = grads(fused, xs, outs_fused, low)
        assert_gate("grad x", g_fused[0], g_base[0], g_ref[0])
        fused_parts = [p.split(fused.split_sizes) for p in g_fused[1:]]  # weight (, bias)
        per_layer = list(zip(*fused_parts))  # [(dWq, dbq), (dWk, dbk), (dWv, dbv)]
        flat_fused = [g for layer in per_layer for g in layer]
        for i, (o, t, r) in enumerate(zip(flat_fused, g_base[1:], g_ref[1:])):
            assert_gate(f"grad of original parameter {i}", o, t, r)


def test_training_tracks_the_three_layer_loss_curve():
    """30 AdamW steps of a tiny attention block from one seed: the loss curves agree."""
    torch.manual_seed(0)
    base = ThreeLinears(32, 4, 2).to(DEV)
    fused = FusedQKV.from_linears(*base.layers(), 4, 2)
    data = [
        (torch.randn(4, 6, 32, device=DEV), torch.randn(4, 4, 6, 8, device=DEV)) for _ in range(5)
    ]
    curves = []
    for model in (base, fused):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for step in range(30):
            x, target = data[step % len(data)]
            q, k, v = model(x)
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            loss = F.mse_loss(out, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    assert curves[0][-1] < 0.9 * curves[0][0]  # it learns
    torch.testing.assert_close(curves[1], curves[0], rtol=1e-3, atol=1e-5)


def test_outputs_are_views_of_one_gemm_output():
    fused = FusedQKV(64, 4, 2).to(DEV)
    q, k, v = fused(torch.randn(2, 5, 64, device=DEV))
    assert q.shape == (2, 4, 5, 16) and k.shape == v.shape == (2, 2, 5, 16)
    storage = q.untyped_storage().data_ptr()
    assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() == storage
    assert q.stride() == (5 * 128, 16, 128, 1)  # (B, H, T, D) view of (B, T, 128)
    assert all(t.stride(-1) == 1 for t in (q, k, v))


def aten_ops(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return prof.events()


@pytest.mark.parametrize("assembled", [True, False], ids=["triton-assemble", "autograd-cat"])
def test_one_gemm_forward_and_one_copy_backward(assembled, monkeypatch):
    """Forward: one GEMM and views. Backward: dq, dk, dv become one matrix (the Triton copy on
    its path, autograd's cat on the plain one), then one mm for dX and one for dW, no adds."""
    from gpushape.kernels._dispatch import use_triton
    from gpushape.kernels.attention import fused_qkv as module

    if assembled and not use_triton(torch.empty(0)):
        pytest.skip("the Triton path runs on CUDA or under TRITON_INTERPRET=1")
    if not assembled:
        monkeypatch.setattr(module, "use_triton", lambda *t: False)
    fused = FusedQKV(64, 4, 2)
    x = torch.randn(2, 5, 64, requires_grad=True)
    outs = fused(x)
    top = Counter(e.name for e in aten_ops(lambda: fused(x)) if e.cpu_parent is None)
    assert top["aten::linear"] == 1
    assert set(top) <= {
        "aten::linear",
        "aten::view",
        "aten::split_with_sizes",
        "aten::transpose",
        "_SplitHeads",
    }
    grad_outs = [torch.randn_like(o) for o in outs]
    ops = Counter(e.name for e in aten_ops(lambda: grads(fused, x, outs, grad_outs)))
    assert ops["aten::cat"] == (0 if assembled else 1) and ops["aten::mm"] == 2
    assert ops["aten::add"] == ops["aten::add_"] == 0  # no partial dX to sum


def test_gradients_when_only_some_outputs_are_used():
    """q alone reaches the loss: dk and dv are zero, dX and dW match the three layers'."""
    torch.manual_seed(0)
    base = ThreeLinears(64, 4, 2).to(DEV)
    fused = FusedQKV.from_linears(*base.layers(), 4, 2)
    x = torch.randn(2, 5, 64, device=DEV, requires_grad=True)
    gq = torch.randn(2, 4, 5, 16, device=DEV)
    g_base = torch.autograd.grad(base(x)[0], [x, *base.parameters()], gq, allow_unused=True)
    g_fused = torch.autograd.grad(fused(x)[0], [x, *fused.parameters()], gq)
    torch.testing.assert_close(g_fused[0], g_base[0])
    dw = g_fused[1].split(fused.split_sizes)
    torch.testing.assert_close(dw[0], g_base[1])
    assert not dw[1].any() and not dw[2].any()


def three_layer_checkpoint(heads=4, kv_heads=2, names=None, bias=True):
    parent = nn.Module()
    parent.attn = ThreeLinears(64, heads, kv_heads, bias, names)
    parent.out = nn.Linear(64, 3)
    return parent


def fused_model(heads=4, kv_heads=2, names=("q_proj", "k_proj", "v_proj"), bias=True):
    parent = nn.Module()
    parent.attn = FusedQKV(64, heads, kv_heads, bias, names=names)
    parent.out = nn.Linear(64, 3)
    return parent


@pytest.mark.parametrize("names", [None, ("query", "key", "value")])
@pytest.mark.parametrize("bias", [True, False])
def test_three_layer_checkpoint_loads_strict_and_saves_back(names, bias):
    original = three_layer_checkpoint(names=names, bias=bias)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    rewritten = fused_model(names=names or ("q_proj", "k_proj", "v_proj"), bias=bias)
    result = rewritten.load_state_dict(torch.load(buffer), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(2, 5, 64)
    for a, b in zip(rewritten.attn(x), original.attn(x)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    saved = rewritten.state_dict()
    assert list(saved) == list(original.state_dict())  # same keys, same order
    for key, value in original.state_dict().items():
        assert torch.equal(saved[key], value)
    again = three_layer_checkpoint(names=names, bias=bias)
    again.load_state_dict(saved, strict=True)  # and back into the three-layer model


def test_fused_layout_also_loads():
    source, target = FusedQKV(64, 4), FusedQKV(64, 4)
    target.load_state_dict({"weight": source.weight.detach(), "bias": source.bias.detach()})
    assert torch.equal(target.weight, source.weight)


def test_bad_checkpoints_are_reported():
    state = three_layer_checkpoint().state_dict()
    del state["attn.k_proj.weight"]
    with pytest.raises(RuntimeError, match=r"found .* but not all of"):
        fused_model().load_state_dict(state)
    state = three_layer_checkpoint(kv_heads=4).state_dict()
    with pytest.raises(RuntimeError, match=r"shapes .* do not match the q, k, v shapes"):
        fused_model(kv_heads=2).load_state_dict(state)


def test_to_linears_round_trip():
    original = ThreeLinears(64, 4, 2)
    fused = FusedQKV.from_linears(*original.layers(), 4, 2)
    for a, b in zip(fused.to_linears(), original.layers()):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


@pytest.mark.parametrize(
    "args, message",
    [
        ((64, 5), "num_heads=5 does not divide embed_dim=64"),
        ((64, 4, 3), "num_kv_heads=3 must be a positive divisor of num_heads=4"),
        ((64, 0), "num_heads must be a positive int"),
        ((64, 4, 0), "num_kv_heads=0 must be a positive divisor"),
    ],
)
def test_bad_configuration(args, message):
    with pytest.raises(ValueError, match=message):
        FusedQKV(*args)


def test_bad_input_and_bad_linears():
    with pytest.raises(ValueError, match=r"expected x of shape \(batch, seq, 64\)"):
        FusedQKV(64, 4)(torch.randn(5, 64))
    with pytest.raises(ValueError, match="must all have a bias or none"):
        FusedQKV.from_linears(nn.Linear(8, 8), nn.Linear(8, 8, bias=False), nn.Linear(8, 8), 2)
    with pytest.raises(ValueError, match=r"expected out_features \(8, 4, 4\)"):
        FusedQKV.from_linears(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), 2, 1)


def test_torch_func_grad_and_vmap_work():
    """Under torch.func transforms the projection stays plain PyTorch (the Triton assembly's
    autograd.Function is not a functorch one): per-sample gradients match autograd's."""
    torch.manual_seed(0)
    fused = FusedQKV(32, 4, 2).to(DEV)
    x = torch.randn(3, 5, 32, device=DEV)
    params = {k: v.detach() for k, v in fused.named_parameters()}

    def loss(p, xi):
        q, k, v = torch.func.functional_call(fused, p, (xi[None],))
        return q.square().sum() + 2 * k.sum() + 3 * v.sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for i in range(x.shape[0]):
        want = torch.autograd.grad(
            loss(dict(fused.named_parameters()), x[i]), list(fused.parameters())
        )
        for name, w in zip(params, want):
            torch.testing.assert_close(per_sample[name][i], w)


def test_compile_fullgraph_matches_eager():
    fused = FusedQKV(64, 4, 2).to(DEV)
    backend = "inductor" if DEV == "cuda" else "aot_eager"
    compiled = torch.compile(fused, fullgraph=True, backend=backend)
    x = torch.randn(2, 5, 64, device=DEV, requires_grad=True)
    eager, comp = fused(x), compiled(x)
    grad_outs = [torch.randn_like(o) for o in eager]
    for a, b in zip(eager, comp):
        torch.testing.assert_close(a, b)
    for a, b in zip(grads(fused, x, eager, grad_outs), grads(fused, x, comp, grad_outs)):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------
# GPU: the kernels that run between the GEMM and the attention
# ---------------------------------------------------------------------------------------------


def cuda_kernels(fn):
    fn()  # warm-up: cuBLAS / attention heuristics, lazy init
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return Counter(e.name for e in prof.events() if e.device_type.name == "CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("heads, kv_heads", [(12, 12), (32, 8)])
def test_gpu_no_kernel_between_gemm_and_sdpa(heads, kv_heads):
    """FusedQKV + SDPA launches as many kernels as the GEMM alone plus SDPA on contiguous
    q, k, v, none of them a copy: nothing (no copy, no contiguous) is added in between.
    (Counts, not names: an attention backend may pick a layout-specific kernel variant.)"""
    fused = FusedQKV(64 * heads, heads, kv_heads).to("cuda", torch.bfloat16)
    x = torch.randn(4, 256, 64 * heads, device="cuda", dtype=torch.bfloat16)
    gqa = dict(enable_gqa=True) if kv_heads != heads else {}

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    with torch.no_grad():
        q, k, v = (t.contiguous() for t in fused(x))
        together = cuda_kernels(lambda: attention(*fused(x)))
        gemm = cuda_kernels(lambda: F.linear(x, fused.weight, fused.bias))
        sdpa = cuda_kernels(lambda: attention(q, k, v))
    assert sum(together.values()) == sum(gemm.values()) + sum(sdpa.values())
    assert not [name for name in together if "copy" in name.lower() or "CatArray" in name]


@pytest.mark.gpu
def test_gpu_bf16_gate_at_bert_width():
    torch.manual_seed(0)
    ref = ThreeLinears(768, 12, 12).to("cuda", torch.float64)
    base = ThreeLinears(768, 12, 12).to("cuda", torch.bfloat16)
    base.load_state_dict(ref.state_dict())
    fused = FusedQKV(768, 12).to("cuda", torch.bfloat16)
    fused.load_state_dict(base.state_dict(), strict=True)
    x = torch.randn(4, 128, 768, device="cuda", dtype=torch.float64)
    for name, o, t, r in zip("qkv", fused(x.bfloat16()), base(x.bfloat16()), ref(x)):
        assert_gate(name, o, t, r)


@pytest.mark.gpu
@pytest.mark.parametrize("heads, kv_heads", [(12, 12), (8, 2)])
def test_gpu_bf16_gradients_and_cuda_graph(heads, kv_heads):
    """bf16 on the GPU: dX and every original parameter's gradient through the Triton assembly
    pass the gate against float64, and a CUDA graph of fwd+bwd replays to the same gradients."""
    torch.manual_seed(0)
    e = 64 * heads
    ref = ThreeLinears(e, heads, kv_heads).to("cuda", torch.float64)
    base = ThreeLinears(e, heads, kv_heads).to("cuda", torch.bfloat16)
    base.load_state_dict(ref.state_dict())
    fused = FusedQKV.from_linears(*base.layers(), heads, kv_heads)
    x = torch.randn(2, 300, e, device="cuda", dtype=torch.float64, requires_grad=True)
    outs_ref = ref(x)
    grad_outs = [torch.randn_like(o) for o in outs_ref]
    low = [g.bfloat16() for g in grad_outs]
    xs = x.detach().bfloat16().requires_grad_()
    g_ref, g_base = grads(ref, x, outs_ref, grad_outs), grads(base, xs, base(xs), low)
    g_fused = grads(fused, xs, fused(xs), low)
    assert_gate("grad x", g_fused[0], g_base[0], g_ref[0])
    parts = list(zip(*[p.split(fused.split_sizes) for p in g_fused[1:]]))
    flat = [g for layer in parts for g in layer]
    for i, (o, t, r) in enumerate(zip(flat, g_base[1:], g_ref[1:])):
        assert_gate(f"grad of original parameter {i}", o, t, r)
    static = {}

    def step():
        static["g"] = grads(fused, xs, fused(xs), low)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(static["g"], g_fused):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
