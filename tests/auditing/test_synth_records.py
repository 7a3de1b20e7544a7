"""Records a rule synthesizes (what a fix would run) carry the tags the tracer gives the same
op, so the cost model puts them in the same memory family as a traced one: a synthesized
Linear's bias gradient is a column sum priced at the "reduction" figure for its width, not at
the copy rate (separate-qkv had priced three 768-wide sums at a quarter of their time)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import gpushape
from gpushape.auditing.pricing.linear import linear_records
from gpushape.auditing.pricing.synth import record, tensor
from gpushape.hardware.profile import calibrated
from gpushape.tracing.cost import op_cost
from gpushape.tracing.families import op_family
from gpushape.tracing.recorder import op_tags


def test_a_synthesized_op_has_the_traced_ops_tags():
    x = tensor((4, 8), "bfloat16")
    assert record("aten.add.Tensor", {"self": x, "other": x}, [x]).tags == ("pointwise",)
    assert op_tags("aten.sum.dim_IntList") == ("reduction",)
    assert op_tags("aten.mm.default") == ()
    assert op_tags("flash_attn._flash_attn_forward") == op_tags("aten.no_such_op.default") == ()


def test_a_synthesized_bias_gradient_costs_what_the_traced_one_does():
    gpu = calibrated("h200-sxm")
    measured = gpu.achievable.memory_efficiency
    (synth,) = [r for r in linear_records(4096, 768, 768, "bfloat16") if "sum" in r.op]

    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(768, 768, device="meta"))
            self.b = torch.nn.Parameter(torch.empty(768, device="meta"))

        def forward(self, x):
            return F.linear(x, self.w, self.b)

    x = torch.empty(4096, 768, device="meta")
    traced = next(
        r
        for r in gpushape.trace(Lin().to(torch.bfloat16), (x.to(torch.bfloat16),), train=True).ops
        if r.op.startswith("aten.sum")
    )
    assert op_family(synth, measured) == op_family(traced, measured) == "reduction@768"
    assert op_cost(synth, gpu).kernel_time_s == op_cost(traced, gpu).kernel_time_s
