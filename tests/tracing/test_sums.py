"""Sums down to one value a channel (tracing/sums.py): which ops they are, which measured figure
prices each, and the probe's grid round-tripped through fit_column_sums.py into the cost model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gpushape.hardware import get_gpu
from gpushape.hardware.profile import apply_profile
from gpushape.tracing.cost import cost, op_cost
from gpushape.tracing.families import memory_family, op_family, sum_family
from gpushape.tracing.sums import CHANNEL_SUM, COLUMN_SUM, grid_key, sum_shape
from gpushape.tracing.tracer import trace

ROOT = Path(__file__).resolve().parents[2]


class _Call(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _op(fn, *shape, channels_last=False):
    x = torch.empty(*shape, dtype=torch.bfloat16, device="meta")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    ops = [r for r in trace(_Call(fn), (x,), train=False).ops if r.kind == "compute"]
    assert len(ops) == 1, [r.op for r in ops]
    return ops[0]


@pytest.mark.parametrize(
    ("fn", "shape", "channels_last", "expected"),
    [
        (lambda x: x.sum(0), (4096, 192), False, (COLUMN_SUM, 4096, 192)),
        (lambda x: x.sum((0, 1)), (8, 512, 768), False, (COLUMN_SUM, 4096, 768)),
        (lambda x: x.sum((0, 2, 3)), (8, 96, 28, 28), False, (CHANNEL_SUM, 8 * 784, 96)),
        (lambda x: x.sum((0, 2, 3), keepdim=True), (8, 96, 7, 7), False, (CHANNEL_SUM, 392, 96)),
        # channels_last, the kept channel is the innermost dimension: a column sum in memory
        (lambda x: x.sum((0, 2, 3)), (8, 96, 28, 28), True, (COLUMN_SUM, 8 * 784, 96)),
        (lambda x: x.sum(-1), (4096, 192), False, None),  # a row sum
        (lambda x: x.sum(), (4096, 192), False, None),
        (lambda x: x.sum((0, 1)), (8, 96, 28, 28), False, None),  # two dimensions kept
    ],
)
def test_a_sum_into_one_value_a_channel_has_its_rows_and_channels(
    fn, shape, channels_last, expected
):
    rec = _op(fn, *shape, channels_last=channels_last)
    assert sum_shape(rec) == expected
    assert memory_family(rec) == (expected[0] if expected else "reduction")


MEASURED = {
    "reduction": 0.48,  # its own sum: 65536 x 1024
    "reduction@768": 0.24,  # at 16384 rows
    "reduction@50176x192": 0.06,
    "reduction@200704x384": 0.40,
    "channel_sum@50176x192": 0.05,
}


def test_the_grid_point_nearest_by_ratio_prices_a_sum():
    assert grid_key(COLUMN_SUM, MEASURED, 50176, 192) == "reduction@50176x192"
    assert grid_key(COLUMN_SUM, MEASURED, 200704, 384) == "reduction@200704x384"
    # the width-only figure stands at 16384 rows, the family's own at 65536 x 1024
    assert grid_key(COLUMN_SUM, MEASURED, 12608, 768) == "reduction@768"
    assert grid_key(COLUMN_SUM, MEASURED, 65536, 1024) == "reduction"
    assert grid_key(CHANNEL_SUM, MEASURED, 40000, 160) == "channel_sum@50176x192"
    no_grid = {k: v for k, v in MEASURED.items() if "x" not in k}
    assert grid_key(COLUMN_SUM, no_grid, 50176, 192) is None


def test_a_sum_takes_the_grid_its_layout_runs_else_the_column_sums_else_its_width():
    column = _op(lambda x: x.sum(0), 50176, 192)
    nchw = _op(lambda x: x.sum((0, 2, 3)), 64, 192, 28, 28)
    assert op_family(column, MEASURED) == "reduction@50176x192"
    assert op_family(nchw, MEASURED) == "channel_sum@50176x192"
    columns_only = {k: v for k, v in MEASURED.items() if not k.startswith("channel_sum")}
    assert op_family(nchw, columns_only) == "reduction@50176x192"
    # a profile without a grid prices as before: the width nearest, NCHW sums at the family's
    widths = {"reduction": 0.48, "reduction@768": 0.24}
    assert op_family(column, widths) == "reduction@768"
    assert op_family(nchw, widths) == "reduction"
    assert sum_family(CHANNEL_SUM, {}, 100, 10) == "reduction"


def _with(efficiency: dict) -> object:
    gpu = get_gpu("h200-sxm")
    rows = {k: {"efficiency": v} for k, v in efficiency.items()}
    return apply_profile(gpu, {"gpu": gpu.name, "memory_efficiency": rows})


def test_an_nchw_convolutions_bias_gradient_is_priced_as_its_channel_sum():
    conv = nn.Conv2d(192, 192, 7, padding=3, groups=192).to(torch.bfloat16)
    x = torch.empty(64, 192, 28, 28, dtype=torch.bfloat16, device="meta")
    backward = [r for r in trace(conv.to("meta"), (x,), train=True).ops if "backward" in r.op]
    assert len(backward) == 1
    slow, fast = (_with({"channel_sum@50176x192": e}) for e in (0.05, 0.5))
    extra = op_cost(backward[0], slow).kernel_time_s - op_cost(backward[0], fast).kernel_time_s
    nbytes = 64 * 192 * 28 * 28 * 2  # grad_output read once more
    bandwidth = slow.attainable_bandwidth_bytes_per_s()
    assert extra == pytest.approx(nbytes / bandwidth * (1 / 0.05 - 1 / 0.5), rel=1e-6)


def test_fit_column_sums_prices_each_timed_sum_at_its_measured_time(monkeypatch, tmp_path):
    """A probe's rows through fit_column_sums.py into a profile: the cost model then prices
    each timed sum at the time measured for it."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "kernels"))
    import fit_column_sums

    timed = [("columns", 50176, 192, [50176, 192], 98.0),
             ("columns", 16384, 768, [16384, 768], 21.0),
             ("columns", 3136, 96, [3136, 96], 7.6),  # under the kernel floor at the copy rate
             ("nchw", 50176, 192, [64, 192, 28, 28], 96.0)]  # fmt: skip
    probe = {
        "environment": {"date_utc": "2026-12-06T17:00:00+00:00"},
        "results": [
            {"layout": layout, "rows": m, "channels": c, "shape": shape, "graph_us": us}
            for layout, m, c, shape, us in timed
        ],
    }
    src = tmp_path / "probe.json"
    src.write_text(json.dumps(probe))
    out = tmp_path / "profile.json"
    shipped = ROOT / "src/gpushape/hardware/profiles/h200-sxm.json"
    argv = [str(src), "--profile", str(shipped), "-o", str(out)]
    assert fit_column_sums.main(argv) == 0
    profile = json.loads(out.read_text())
    spec = apply_profile(get_gpu(profile["gpu"]), profile)
    for layout, m, c, shape, us in timed:
        fn = (lambda x: x.sum(0)) if layout == "columns" else (lambda x: x.sum((0, 2, 3)))
        rec = _op(fn, *shape)
        assert op_family(rec, spec.achievable.memory_efficiency) == (
            f"{COLUMN_SUM if layout == 'columns' else CHANNEL_SUM}@{m}x{c}"
        )
        assert op_cost(rec, spec).kernel_time_s == pytest.approx(us * 1e-6, rel=0.02)
    assert len(cost(trace(_Call(lambda x: x.sum(0)), (torch.empty(8, 8),)), spec).ops) == 1
    with pytest.raises(SystemExit, match="not a probe_column_sums"):
        fit_column_sums.fit({**probe, "results": [{"shape": [2, 2]}]}, profile)
    sys.modules.pop("fit_column_sums", None)
