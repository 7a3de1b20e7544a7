"""KVCache: in-place appends equal torch.cat, no per-step copy of the cache, clear errors, the
graph-safe static API (device position, attention mask, overflow flag) and, on the GPU, a
decode step captured in a CUDA graph and replayed."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from gpushape.kernels.attention.kv_cache import KVCache

DEV = "cuda" if torch.cuda.is_available() else "cpu"
B, H, D = 2, 3, 8


def steps(t, dtype=torch.float32):
    return (
        torch.randn(B, H, t, D, device=DEV, dtype=dtype),
        torch.randn(B, H, t, D, device=DEV, dtype=dtype),
    )


def test_append_writes_in_place_and_equals_cat():
    cache = KVCache(B, H, 16, D, device=DEV)
    k_ptr, v_ptr = cache.k_buffer.data_ptr(), cache.v_buffer.data_ptr()
    k_all, v_all = torch.empty(B, H, 0, D, device=DEV), torch.empty(B, H, 0, D, device=DEV)
    for t in (3, 1, 1, 4):
        k, v = steps(t)
        k_view, v_view = cache.append(k, v)
        k_all, v_all = torch.cat([k_all, k], dim=2), torch.cat([v_all, v], dim=2)
        assert torch.equal(k_view, k_all) and torch.equal(v_view, v_all)
        assert k_view.data_ptr() == k_ptr and v_view.data_ptr() == v_ptr  # views, no copies
    assert cache.length == 9
    assert cache.k_buffer.data_ptr() == k_ptr  # never reallocated


def test_append_copies_only_the_new_steps():
    cache = KVCache(B, H, 4096, D, device=DEV)
    cache.append(*steps(4000))
    k, v = steps(1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cache.append(k, v)
    copies = [e for e in prof.events() if e.name == "aten::copy_"]
    names = {e.name for e in prof.events()}
    assert len(copies) == 2 and "aten::cat" not in names and "aten::empty" not in names


def test_full_cache_raises_and_keeps_its_state():
    cache = KVCache(B, H, 4, D, device=DEV)
    cache.append(*steps(3))
    before = cache.k_cache.clone()
    with pytest.raises(ValueError, match=r"KVCache is full: length 3 \+ 2 new steps > max_len 4"):
        cache.append(*steps(2))
    assert cache.length == 3 and torch.equal(cache.k_cache, before)
    cache.reset()
    assert cache.append(*steps(4))[0].shape == (B, H, 4, D)


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("heads", ValueError, r"k must have shape \(batch=2, heads=3, steps, head_dim=8\)"),
        ("3d", ValueError, "k must have shape"),
        ("steps", ValueError, "k and v need the same number"),
        ("dtype", TypeError, "k is torch.float16, the cache holds torch.float32"),
        ("device", RuntimeError, "all tensors must be on one device"),
    ],
)
def test_bad_steps(case, error, message):
    cache = KVCache(B, H, 8, D, device=DEV)
    k, v = steps(2)
    if case == "heads":
        k = torch.randn(B, H + 1, 2, D, device=DEV)
    elif case == "3d":
        k = k[0]
    elif case == "steps":
        v = v[:, :, :1]
    elif case == "dtype":
        k = k.half()
    else:
        k = k.to("meta")
    for append in (cache.append, cache.append_static):
        with pytest.raises(error, match=message):
            append(k, v)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(max_len=0), ValueError, "max_len must be a positive int"),
        (dict(batch=True), ValueError, "batch must be a positive int"),
        (dict(dtype=torch.int32), TypeError, "dtype must be a floating dtype"),
    ],
)
def test_bad_construction(kwargs, error, message):
    args = dict(batch=B, num_heads=H, max_len=8, head_dim=D) | kwargs
    with pytest.raises(error, match=message):
        KVCache(**args)


def test_static_append_matches_eager_and_masks_causally():
    eager, static = KVCache(B, H, 12, D, device=DEV), KVCache(B, H, 12, D, device=DEV)
    for t in (5, 1, 1, 2):
        k, v = steps(t)
        k_eager, v_eager = eager.append(k, v)
        k_full, v_full = static.append_static(k, v)
        assert k_full.shape == (B, H, 12, D)
        n = eager.length
        assert torch.equal(k_full[:, :, :n], k_eager) and torch.equal(v_full[:, :, :n], v_eager)
        mask = static.attention_mask(t)  # (t, max_len)
        query_pos = torch.arange(n - t, n, device=DEV)[:, None]
        assert torch.equal(mask, torch.arange(12, device=DEV)[None, :] <= query_pos)
        q = torch.randn(B, H, t, D, device=DEV)
        out_static = F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask)
        out_eager = F.scaled_dot_product_attention(q, k_eager, v_eager, attn_mask=mask[:, :n])
        torch.testing.assert_close(out_static, out_eager)
    assert int(static.position) == eager.length == 9


def test_static_overflow_is_flagged_not_written():
    cache = KVCache(B, H, 4, D, device=DEV)
    k, v = steps(3)
    cache.append_static(k, v)
    cache.check()
    cache.append_static(*steps(2))  # steps 4 and 5: one fits, one goes to the spare slot
    assert bool(cache.overflowed)
    assert torch.equal(cache.k_cache[:, :, :3], k)
    with pytest.raises(ValueError, match="KVCache overflowed: append_static wrote past max_len 4"):
        cache.check()
    cache.reset()
    assert not bool(cache.overflowed) and int(cache.position) == 0


def test_buffers_follow_the_module_and_stay_out_of_checkpoints():
    cache = KVCache(B, H, 8, D, dtype=torch.float16, device=DEV)
    assert cache.state_dict() == {}
    moved = cache.to(torch.float32)
    assert moved.k_cache.dtype == torch.float32 and moved.position.dtype == torch.int64
    assert "max_len=8" in repr(cache)


@pytest.mark.gpu
def test_gpu_decode_step_in_a_cuda_graph():
    cache, eager = (KVCache(B, H, 64, D, torch.bfloat16, "cuda") for _ in range(2))
    k0, v0 = steps(5, torch.bfloat16)
    cache.append_static(k0, v0)
    eager.append(k0, v0)
    q, k, v = (torch.empty(B, H, 1, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def decode(c):
        k_full, v_full = c.append_static(k, v)
        return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=c.attention_mask(1))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up the kernels on a scratch cache, outside capture
        decode(KVCache(B, H, 64, D, torch.bfloat16, "cuda"))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # capture records the step; it does not run it
        out = decode(cache)
    for _ in range(4):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        k_eager, v_eager = eager.append(k.clone(), v.clone())
        expected = F.scaled_dot_product_attention(q, k_eager, v_eager)
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    assert int(cache.position) == eager.length == 9
    cache.check()


@pytest.mark.gpu
def test_gpu_append_launches_the_same_kernels_and_allocates_nothing_at_any_length():
    kernel_sets = []
    for length in (128, 32767):
        cache = KVCache(4, 32, 32768, 128, torch.bfloat16, "cuda")
        cache.length = length
        k, v = (torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            cache.append(k, v)
            torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() == before
        kernel_sets.append(sorted(e.name for e in prof.events() if e.device_type.name == "CUDA"))
    assert kernel_sets[0] == kernel_sets[1] and len(kernel_sets[0]) == 2
