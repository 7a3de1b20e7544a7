"""benchmarks/kernels/bench_max_pool.py on the CPU: its byte counts, its table, and a smoke run
(`--device cpu`, tiny shapes, Triton in the interpreter, no torch.compile)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "bench_max_pool.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpushape_bench_max_pool", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_min_bytes_of_resnet_stem(bench):
    x_bytes = 256 * 64 * 112 * 112 * 2
    outputs = 256 * 64 * 56 * 56
    got = bench.min_bytes((256, 64, 112, 112), torch.bfloat16, (3, 2, 1))
    assert got["fwd"] == got["bwd"] == x_bytes + 2 * outputs + outputs == 565_182_464
    assert got["fwd+bwd"] == 2 * got["fwd"]
    theirs = bench.torch_bytes((256, 64, 112, 112), torch.bfloat16, (3, 2, 1))
    assert theirs["fwd"] - got["fwd"] == 7 * outputs


def test_table_lists_every_variant_and_ratio(bench):
    rows = [
        dict(shape=[2, 4, 8, 8], layout="cl", direction=d, variant=v, median_ms=t, gbps=g)
        for d in bench.DIRECTIONS
        for v, t, g in (("eager", 0.3, 100.0), ("compile", 0.2, 150.0), ("gpushape", 0.1, 300.0))
    ]
    for r in rows:
        r["median_us"] = 1e3 * r["median_ms"]
    bench.add_ratios(rows, copy_gbps=600.0, spec_copy_gbps=None)
    ours = next(r for r in rows if r["variant"] == "gpushape")
    assert ours["speedup_vs_eager"] == pytest.approx(3.0) and ours["pct_copy"] == 0.5
    table = bench.format_table(rows).splitlines()
    assert len(table) == 2 + len(bench.DIRECTIONS)
    assert "100.0" in table[2] and "300" in table[2] and "50%" in table[2] and "n/a" in table[2]


def test_parse_shapes(bench):
    assert bench.parse_shapes("2x4x8x8:nchw,3x5x9x9") == [
        ((2, 4, 8, 8), "nchw"),
        ((3, 5, 9, 9), "cl"),
    ]
    with pytest.raises(SystemExit, match="layout 'nhwc' unknown"):
        bench.parse_shapes("2x4x8x8:nhwc")


def test_smoke_run_on_cpu(bench, interpret, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--quick", "--variants", "eager,gpushape", "--out", str(out)]
    assert bench.main([*args, "--shapes", "2x4x9x9:cl,2x3x8x7:nchw"]) == 0
    result = json.loads(out.read_text())
    assert "torch" in result["environment"] and result["checks"]
    assert {(r["layout"], r["direction"], r["variant"]) for r in result["results"]} == {
        (layout, d, v)
        for layout in ("cl", "nchw")
        for d in bench.DIRECTIONS
        for v in ("eager", "gpushape")
    }
    assert capsys.readouterr().out.strip().splitlines()[-1].lstrip().startswith("2x3x8x7")


def test_the_specs_copy_rate_is_read_as_the_gpu_run_reads_it(bench):
    """(The first H200 run failed here: a method read as an attribute.)"""
    from gpushape.hardware import calibrated, get_gpu

    gbps, source = bench.copy_gbps_of(calibrated(get_gpu("h200")))
    assert 3000 < gbps < 4800 and source.startswith("h200")
