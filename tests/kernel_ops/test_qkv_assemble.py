"""FusedQKV's backward glue (_qkv_assemble.py): dq, dk, dv written into one gradient of the
fused GEMM output, against torch.cat of the transposed parts, bitwise, on every path (the Triton
kernel on CUDA and under TRITON_INTERPRET=1, the forward's plan, the torch copy)."""

import pytest
import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, seq", [(4, 2, 16, 5), (3, 3, 24, 70), (8, 1, 8, 1)]
)
@pytest.mark.parametrize("layout", ["contiguous", "btHd", "last-dim-strided"])
def test_assembled_gradient_equals_the_cat_of_the_parts(heads, kv_heads, head_dim, seq, layout):
    """assemble_heads (Triton on CUDA / under the interpreter, copy_ otherwise) against
    torch.cat of the transposed parts, bitwise: head counts that are not powers of two, a head
    size that is not, T past one tile, gradients in (B, H, T, D), in (B, T, H, D) transposed
    back, and with a strided last dimension (the copy_ fallback); a missing part is zeros."""
    from gpushape.kernels._dispatch import use_triton
    from gpushape.kernels.attention._qkv_assemble import assemble_heads, assembly_plan

    batch = 2
    sizes = (heads, kv_heads, kv_heads)

    def part(h):
        if layout == "contiguous":
            return torch.randn(batch, h, seq, head_dim, device=DEV)
        if layout == "btHd":
            return torch.randn(batch, seq, h, head_dim, device=DEV).transpose(1, 2)
        return torch.randn(batch, h, seq, 2 * head_dim, device=DEV)[..., ::2]

    parts = [part(h) for h in sizes]
    r = sum(sizes) * head_dim
    out = assemble_heads(tuple(parts), sizes, (batch, seq, r), torch.float32, torch.device(DEV))
    want = torch.cat([p.transpose(1, 2) for p in parts], dim=2).reshape(batch, seq, r)
    assert out.is_contiguous() and torch.equal(out, want)
    if use_triton(want):  # the forward's plan: taken for contiguous parts, checked otherwise
        plan = assembly_plan((batch, seq, r), sizes, torch.float32, torch.device(DEV))
        planned = assemble_heads(
            tuple(parts), sizes, (batch, seq, r), torch.float32, torch.device(DEV), plan
        )
        assert torch.equal(planned, want)
    missing = assemble_heads(
        (parts[0], None, parts[2]), sizes, (batch, seq, r), torch.float32, torch.device(DEV)
    )
    cut = heads * head_dim, (heads + kv_heads) * head_dim
    assert torch.equal(missing[..., cut[0] : cut[1]], torch.zeros_like(want[..., cut[0] : cut[1]]))
    assert torch.equal(missing[..., : cut[0]], want[..., : cut[0]])
    assert torch.equal(missing[..., cut[1] :], want[..., cut[1] :])


def test_more_programs_than_the_grid_holds_take_the_torch_copy(monkeypatch):
    """batch x heads past CUDA's 65535 grid rows: no plan, and the copy_ path, same result."""
    from gpushape.kernels.attention import _qkv_assemble as qa

    monkeypatch.setattr(qa, "_MAX_GRID_Y", 7)  # 2 x (4 + 2 + 2) = 16 programs > 7
    sizes, shape = (4, 2, 2), (2, 5, 128)
    assert qa.assembly_plan(shape, sizes, torch.float32, torch.device(DEV)) is None
    parts = [torch.randn(2, h, 5, 16, device=DEV) for h in sizes]
    out = qa.assemble_heads(tuple(parts), sizes, shape, torch.float32, torch.device(DEV))
    want = torch.cat([p.transpose(1, 2) for p in parts], dim=2).reshape(shape)
    assert torch.equal(out, want)
