"""benchmarks/kernels/bench_grn.py on the CPU: its byte counts, its table, its shapes, its eager
variant, and a smoke run (`--device cpu`, tiny shapes, Triton in the interpreter, no
torch.compile); and a smoke run of probe_grn_param_dtypes.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from ._grn_cases import torch_grn

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpushape_{name}", KERNELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load("bench_grn")


def test_bytes_of_convnextv2_tiny_stage1(bench):
    s = 64 * 56 * 56 * 384 * 2  # bf16 x
    assert bench.min_bytes((64, 56, 56, 384)) == {"fwd": 2 * s, "fwd+bwd": 5 * s}
    assert bench.kernel_bytes((64, 56, 56, 384)) == {"fwd": 3 * s, "fwd+bwd": 8 * s}
    assert bench.min_bytes((64, 56, 56, 384))["fwd"] == 308_281_344
    assert bench.x_bytes((2, 3, 4, 5), torch.float32) == 480


def test_table_lists_every_row_and_ratio(bench):
    rows = [
        dict(
            shape=[2, 4, 8, 8],
            layout="nhwc",
            direction=d,
            variant=v,
            median_ms=t,
            gbps=g,
            kernel_gbps=1.5 * g,
        )
        for d in bench.DIRECTIONS
        for v, t, g in (("eager", 0.3, 100.0), ("compile", 0.2, 150.0), ("gpushape", 0.1, 300.0))
    ]
    bench.add_ratios(rows, copy_gbps=600.0)
    ours = next(r for r in rows if r["variant"] == "gpushape")
    assert ours["speedup_vs_eager"] == pytest.approx(3.0) and ours["pct_copy"] == 0.5
    assert ours["speedup_vs_compile"] == pytest.approx(2.0)
    table = bench.format_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    line = next(t for t in table[2:] if "gpushape" in t)
    assert "0.100" in line and " 300" in line and "50%" in line and " 450" in line
    assert line.rstrip().endswith("3.00")
    assert next(t for t in table[2:] if "eager" in t).rstrip().endswith("1.00")


def test_parse_shapes(bench):
    assert bench.parse_shapes("2x4x8x8:nchw,3x5x9x9,1x2x3x4:nchw-cl") == [
        ((2, 4, 8, 8), "nchw"),
        ((3, 5, 9, 9), "nhwc"),
        ((1, 2, 3, 4), "nchw-cl"),
    ]
    with pytest.raises(SystemExit, match="layout 'cl' unknown"):
        bench.parse_shapes("2x4x8x8:cl")
    with pytest.raises(SystemExit, match="not N x H x W x C"):
        bench.parse_shapes("2x4x8")


@pytest.mark.parametrize("layout", ["nhwc", "nchw-cl"])
def test_eager_variant_is_timms_formula(bench, layout):
    x, w, b, _ = bench.make_inputs((2, 3, 4, 6), layout, "cpu")
    assert isinstance(w, torch.nn.Parameter) and x.is_contiguous(
        memory_format=bench.LAYOUTS[layout][1]
    )
    channels_last = bench.LAYOUTS[layout][0]
    fn, source = bench.eager_grn(channels_last, w, b)
    assert "timm" in source
    y = fn(x)
    assert torch.equal(y, torch_grn(x, w, b, bench.EPS, channels_last))
    _, dw, db = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))  # its parameters: ours
    assert dw.shape == db.shape == (6,)


def test_smoke_run_on_cpu(bench, interpret, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--quick", "--variants", "eager,gpushape", "--out", str(out)]
    assert bench.main([*args, "--shapes", "2x4x5x9:nhwc,2x3x4x7:nchw,1x5x3x6:nchw-cl"]) == 0
    result = json.loads(out.read_text())
    assert "torch" in result["environment"] and len(result["checks"]) == 3
    assert all(c.startswith("pass") for c in result["checks"].values())
    assert {(r["layout"], r["direction"], r["variant"]) for r in result["results"]} == {
        (layout, d, v)
        for layout in ("nhwc", "nchw", "nchw-cl")
        for d in bench.DIRECTIONS
        for v in ("eager", "gpushape")
    }
    ours = next(r for r in result["results"] if r["variant"] == "gpushape")
    assert ours["kernel_bytes"] == 3 * 2 * 4 * 5 * 9 * 2 and "speedup_vs_eager" in ours
    assert capsys.readouterr().out.strip().splitlines()[-1].lstrip().startswith("1x5x3x6")


def test_param_dtypes_probe_smoke_run_on_cpu(interpret, tmp_path, capsys):
    probe = _load("probe_grn_param_dtypes")
    out = tmp_path / "probe.json"
    assert probe.main(["--device", "cpu", "--shape", "2x3x4x20", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["layout"] for r in rows] == ["nchw", "nhwc"]
    for r in rows:  # the interpreter runs one algorithm whatever the parameters' dtype
        assert r["bfloat16"]["calls"] == 3 and r["float32"]["calls"] == 2
        assert r["bfloat16"]["deterministic"] and r["float32"]["deterministic"]
        assert r["y_bf16_vs_fp32"]["elements"] == r["dx_bf16_vs_fp32"]["elements"] == 0
        assert r["bfloat16"]["y_vs_exact"]["max_abs"] <= 2**-4  # a unit at most (|y| < 16)
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("of 480")
    with pytest.raises(SystemExit):
        probe.main(["--device", "cpu", "--shape", "2x3x4", "--out", str(out)])
