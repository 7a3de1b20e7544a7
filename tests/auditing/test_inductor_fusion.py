"""What Inductor's fusion takes off a compiled step's GPU time
(auditing/pricing/inductor_fusion.py), and the storages the tracer records for it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpushape
from gpushape.auditing.context import AuditContext
from gpushape.auditing.pricing.inductor_fusion import (
    compiled_fusion_saving_s,
    outside_share,
    runs,
)
from gpushape.auditing.pricing.inductor_kernels import is_extern
from gpushape.hardware import get_gpu

from .models import ManyOpsRmsNorm


def _ctx(model: nn.Module, *shape: int, train: bool = True) -> AuditContext:
    x = torch.empty(*shape, device="meta", dtype=torch.bfloat16)
    model = model.to(device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(model, (x,), train=train)
    gpu = get_gpu("h200-sxm")
    return AuditContext(trace=trace, cost=gpushape.cost(trace, gpu), gpu=gpu)


def test_views_share_their_base_storage_and_new_tensors_get_their_own():
    class ViewThenAdd(nn.Module):
        def forward(self, x):
            return x.t().contiguous() + x.t()

    trace = gpushape.trace(ViewThenAdd(), (torch.empty(8, 4, device="meta"),))
    ops = {r.name: r for r in trace.ops}
    copy, add = ops["clone"], ops["add"]
    assert copy.inputs[0].storage == add.inputs[1].storage  # both read x's memory
    assert copy.outputs[0].storage == add.inputs[0].storage  # the copy is what add reads
    assert copy.outputs[0].storage != copy.inputs[0].storage
    assert add.outputs[0].storage not in (add.inputs[0].storage, add.inputs[1].storage)


def test_a_chain_between_two_gemms_keeps_only_its_edges():
    ctx = _ctx(nn.Sequential(nn.Linear(256, 256), ManyOpsRmsNorm(256), nn.Linear(256, 256)),
               4096, 256, train=False)  # fmt: skip
    (run,) = runs(ctx.trace, ctx.cost)  # the norm's ops, between the two GEMMs
    assert len(run) >= 5
    shares = outside_share(run, _readers(ctx))
    first, last = run[0].index, run[-1].index
    cast = run[0]  # x.float(): reads the GEMM's bf16 output from memory, its fp32 copy stays
    assert cast.name == "_to_copy"
    read, wrote = cast.inputs[0].nbytes, cast.outputs[0].nbytes
    assert shares[first] == pytest.approx(read / (read + wrote))
    inner = [i for i in shares if i not in (first, last)]
    assert min(shares[i] for i in inner) < 0.5  # the chain's own tensors never reach memory
    saving = compiled_fusion_saving_s(ctx)
    eager = sum(ctx.op_cost(r).kernel_time_s for r in run)
    assert 0.3 * eager < saving < eager


def test_nothing_is_saved_on_a_single_op_between_gemms():
    ctx = _ctx(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)), 4096, 256,
               train=False)  # fmt: skip
    assert compiled_fusion_saving_s(ctx) == 0.0  # ReLU reads the GEMM's output, writes the next's


def test_a_tensor_the_backward_reads_is_written_in_the_forward():
    class SavesMid(nn.Module):  # sigmoid's output is saved for its backward
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)

        def forward(self, x):
            return self.b(torch.sigmoid(self.a(x) * 2.0))

    ctx = _ctx(SavesMid(), 4096, 256)
    forward = next(r for r in runs(ctx.trace, ctx.cost) if r[0].phase == "forward")
    shares = outside_share(forward, _readers(ctx))
    sigmoid = next(r for r in forward if r.name == "sigmoid")
    assert shares[sigmoid.index] == 1.0 or shares[sigmoid.index] > 0.4  # its output escapes


def test_a_depthwise_convolution_is_an_extern_kernel():
    conv = nn.Conv2d(32, 32, 3, padding=1, groups=32)
    ctx = _ctx(conv, 8, 32, 16, 16)
    by_index = {c.index: c for c in ctx.cost.ops}
    convs = [r for r in ctx.trace.ops if r.name.startswith("convolution")]
    assert convs and all(by_index[r.index].gemm_flops == 0 for r in convs)  # priced memory-bound
    assert all(is_extern(r, by_index[r.index]) for r in convs)  # but cuDNN runs it, not Inductor


def test_compile_mode_prices_a_decoder_norm_below_its_eager_kernels():
    model = nn.Sequential(nn.Linear(512, 512), ManyOpsRmsNorm(512), nn.Linear(512, 512))
    x = torch.empty(8192, 512, device="meta", dtype=torch.bfloat16)
    model = model.to(device="meta", dtype=torch.bfloat16)
    eager = gpushape.audit(model, (x,), "h200", train=True, mode="eager").step.gpu_s
    compiled = gpushape.audit(model, (x,), "h200", train=True, mode="compile").step.gpu_s
    assert compiled < 0.8 * eager


def _readers(ctx: AuditContext):
    from gpushape.auditing.pricing.inductor_fusion import _readers as readers

    return readers(ctx.trace)


def test_a_trace_on_a_real_device_numbers_no_storages_and_prices_no_fusion():
    """Keeping every storage alive until the trace ends costs nothing on meta, the memory of
    every intermediate on a real device: there the tracer records none, and compile mode
    prices Inductor's fusions by the findings alone."""
    from gpushape.auditing.pricing.inductor_fusion import has_storages

    model = nn.Sequential(nn.Linear(64, 64), ManyOpsRmsNorm(64), nn.Linear(64, 64))
    x = torch.randn(32, 64)
    on_cpu = gpushape.trace(model, (x,), train=True, device="cpu")
    assert not has_storages(on_cpu)
    gpu = get_gpu("h200-sxm")
    ctx = AuditContext(trace=on_cpu, cost=gpushape.cost(on_cpu, gpu), gpu=gpu)
    assert compiled_fusion_saving_s(ctx) == 0.0
    assert has_storages(gpushape.trace(model.to("meta"), (x.to("meta"),), train=True))


def test_two_halves_of_one_output_are_two_reads_and_one_view_read_twice_is_one():
    class GatedHalves(nn.Module):  # a fused gate/up projection, then SiLU(gate) * up
        def __init__(self):
            super().__init__()
            self.gate_up, self.down = nn.Linear(256, 1024), nn.Linear(512, 256)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(torch.nn.functional.silu(gate) * up)

    ctx = _ctx(GatedHalves(), 4096, 256, train=False)
    (run,) = runs(ctx.trace, ctx.cost)
    silu, mul = (next(r for r in run if r.name == n) for n in ("silu", "mul"))
    gate, up = silu.inputs[0], mul.inputs[1]
    assert gate.storage == up.storage and gate.offset != up.offset  # one output, two halves
    shares = outside_share(run, _readers(ctx))
    # mul reads `up` from memory (a half silu never read) and writes what the GEMM reads
    assert shares[mul.index] == pytest.approx(2 / 3)

    class SameHalfTwice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(256, 512), nn.Linear(512, 256)

        def forward(self, x):
            h = self.a(x)
            return self.b(torch.sigmoid(h) * h.view(h.shape))

    ctx = _ctx(SameHalfTwice(), 4096, 256, train=False)
    (run,) = runs(ctx.trace, ctx.cost)
    mul = next(r for r in run if r.name == "mul")
    shares = outside_share(run, _readers(ctx))
    assert shares[mul.index] == pytest.approx(1 / 3)  # h already read by sigmoid: the output only


def test_an_op_fused_with_a_transposing_copy_runs_at_the_copys_pace():
    from gpushape.auditing.pricing.inductor_fusion import copy_paced
    from gpushape.hardware.profile import calibrated

    class GatherHeads(nn.Module):  # heads (B, H, T, D) back to (B, T, H*D), then scaled
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(512, 64)

        def forward(self, x):  # x: (B, H, T, 64)
            h = self.a(x).transpose(1, 2).contiguous()  # the copy
            return self.b(torch.flatten(h, 2) * 2.0)  # the op reading it

    model = GatherHeads().to(device="meta", dtype=torch.bfloat16)
    x = torch.empty(8, 8, 1024, 64, device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(model, (x,), train=False)
    gpu = calibrated("h200-sxm")  # the shipped profile measured the copy families
    ctx = AuditContext(trace=trace, cost=gpushape.cost(trace, gpu), gpu=gpu)
    (run,) = runs(ctx.trace, ctx.cost)
    paced = copy_paced(run, gpu.achievable)
    mul = next(r for r in run if r.name == "mul")
    a = gpu.achievable
    assert paced == {mul.index: pytest.approx(a.memory("elementwise") / a.memory("permuted_copy"))}
    # the mul's traffic (its output, read by the GEMM) now costs more than it did eagerly
    shares = outside_share(run, _readers(ctx))
    assert shares[mul.index] * paced[mul.index] > 1.0
    assert compiled_fusion_saving_s(ctx) < sum(ctx.op_cost(r).kernel_time_s for r in run) / 2
