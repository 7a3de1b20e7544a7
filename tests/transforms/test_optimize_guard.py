"""optimize() rolls back a rewrite that the audit of the whole rewritten step predicts slower."""

from __future__ import annotations

import torch
from torch import nn

from gpushape import audit
from gpushape.transforms._optimize import _Guard


class Extra(nn.Module):
    """The same MLP with one more layer: more GPU work, more launches."""

    def __init__(self, extra: bool):
        super().__init__()
        self.a, self.b = nn.Linear(1024, 4096), nn.Linear(4096, 1024)
        self.c = nn.Linear(1024, 1024) if extra else nn.Identity()

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))))


def _guard(model, x):
    before = audit(model, (x,), "h200", dtype=torch.bfloat16, train=True)
    return _Guard(before, (x,), "h200", torch.bfloat16, True, "eager")


def test_a_slower_rewrite_is_named_and_a_faster_one_becomes_the_baseline():
    x = torch.randn(4096, 1024, device="meta")
    guard = _guard(Extra(extra=False), x)
    reason = guard.slower(Extra(extra=True))
    assert reason is not None and reason.startswith("predicted slower on this chip: step ")
    assert guard.slower(Extra(extra=False)) is None  # the same step: no change
    faster = _guard(Extra(extra=True), x)
    assert faster.slower(Extra(extra=False)) is None
    assert faster.step == _guard(Extra(extra=False), x).step  # now measured against that


def test_a_rewrite_that_saves_gpu_time_but_lengthens_a_host_bound_step_is_rolled_back():
    from gpushape.transforms._optimize import _predicted

    x = torch.randn(256, 1024, device="meta")  # little GPU work: the H200's host sets the pace
    guard = _guard(Extra(extra=False), x)
    before = audit(Extra(extra=False), (x,), "h200", dtype=torch.bfloat16, train=True)
    assert before.step.bound == "host"

    class MoreOps(Extra):  # no ReLU kernel on the GPU, three more ops for the host
        def forward(self, x):
            h = self.a(x)
            h = h * 1.0 + 0.0
            return self.c(self.b(h * 1.0))

    after = audit(MoreOps(extra=False), (x,), "h200", dtype=torch.bfloat16, train=True)
    assert _predicted(after)[1] > _predicted(before)[1]  # a longer wall clock
    assert guard.slower(MoreOps(extra=False)) is not None


def test_the_step_level_fix_is_named_with_where_it_lives():
    from gpushape import optimize
    from gpushape.models import create_model

    model, inputs = create_model("resnet50", batch=8)  # host-bound: launch-bound fires
    _, report = optimize(model, inputs, gpu="h200", train=True)
    graphs = [r for r in report.skipped if r.transform == "cuda-graphs"]
    assert graphs and "capture_step" in graphs[0].reason


class Elementwise(Extra):
    """Two elementwise kernels on the hidden activations: GPU work and two ops for the host."""

    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h * 1.5 + 0.5))


class Views(Extra):
    """The elementwise ops folded away (less GPU work), and many views: host work only."""

    def forward(self, x):
        h = self.a(x)
        for _ in range(40):
            h = h.view(-1).view(h.shape)
        return self.c(self.b(h))


def test_where_graph_layers_will_be_tried_a_host_bound_rollback_is_judged_on_the_graph():
    """graphable (eager training on a GPU, graph-layers next): a rewrite that saves GPU time
    but dispatches more is kept where the graph mode predicts it faster; one that adds GPU
    work is rolled back either way."""
    x = torch.randn(256, 1024, device="meta")  # host-bound on the H200
    before = audit(Elementwise(extra=False), (x,), "h200", dtype=torch.bfloat16, train=True)
    assert before.step.bound == "host"
    plain = _Guard(before, (x,), "h200", torch.bfloat16, True, "eager")
    assert plain.slower(Views(extra=False)) is not None  # the host's dispatch grew
    graphable = _Guard(before, (x,), "h200", torch.bfloat16, True, "eager", graphable=True,
                       model=Elementwise(extra=False))  # fmt: skip
    assert graphable.slower(Views(extra=False)) is None
    more_gpu = _Guard(before, (x,), "h200", torch.bfloat16, True, "eager", graphable=True,
                      model=Elementwise(extra=False))  # fmt: skip
    assert more_gpu.slower(Elementwise(extra=True)) is not None


def test_a_transform_asked_for_by_name_that_finds_nothing_says_so():
    """`--transforms s2d-stem` on a model without a stem printed an empty table: a named
    transform with no place to rewrite is reported as not applied, with the reason; one that
    applied is not."""
    from gpushape.transforms import optimize

    x = torch.randn(64, 1024, device="meta")
    _, report = optimize(Extra(extra=False), (x,), gpu="h200", transforms=["s2d-stem", "sdpa"])
    named = {r.transform: r.reason for r in report.skipped}
    assert named == {
        "s2d-stem": "found nothing in this model that it rewrites",
        "sdpa": "found nothing in this model that it rewrites",
    }
    assert not report.applied
    # a finding-driven run names nothing it was not asked for
    _, report = optimize(Extra(extra=False), (x,), gpu="h200")
    assert all(r.reason != "found nothing in this model that it rewrites" for r in report.skipped)
