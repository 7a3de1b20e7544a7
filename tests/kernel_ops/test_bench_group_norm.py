"""benchmarks/kernels/bench_group_norm.py on the CPU: its byte counts, its table, its shapes, its
eager variant, and a smoke run (`--device cpu`, tiny shapes, Triton in the interpreter, no
torch.compile)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpushape_{name}", KERNELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load("bench_group_norm")


def test_bytes_of_resnet50_gn_stage1(bench):
    s = 64 * 256 * 56 * 56 * 2  # bf16 x
    assert bench.min_bytes((64, 256, 56, 56)) == {"fwd": 2 * s, "fwd+bwd": 5 * s}
    assert bench.kernel_bytes((64, 256, 56, 56)) == {"fwd": 3 * s, "fwd+bwd": 8 * s}
    assert bench.min_bytes((64, 256, 56, 56))["fwd"] == 205_520_896
    assert bench.x_bytes((2, 3, 4, 5), torch.float32) == 480


def test_the_default_cases(bench):
    assert len(bench.SHAPES) == 8 and len(bench.QUICK_SHAPES) == 3
    assert set(bench.QUICK_SHAPES) <= set(bench.SHAPES)
    for (_, c, _, _), case in bench.SHAPES:
        assert c % case.groups == 0 and case.activation in bench.ACTIVATIONS
        assert case.layout in bench.LAYOUTS
    resnet = [s for s, case in bench.SHAPES if case.activation == "relu"]
    assert [c for _, c, _, _ in resnet] == [64, 256, 512, 1024]
    assert {case.layout for _, case in bench.SHAPES} == {"nchw", "nchw-cl"}
    assert {case.groups for _, case in bench.SHAPES} == {1, 32}


def _rows(bench):
    return [
        dict(
            shape=[2, 4, 8, 8],
            groups=2,
            activation="relu",
            layout="nchw",
            direction=d,
            variant=v,
            median_ms=t,
            gbps=g,
            kernel_gbps=1.5 * g,
        )
        for d in bench.DIRECTIONS
        for v, t, g in (("eager", 0.3, 100.0), ("compile", 0.2, 150.0), ("gpushape", 0.1, 300.0))
    ]


def test_table_lists_every_row_and_ratio(bench):
    rows = _rows(bench)
    other = [{**r, "groups": 1, "median_ms": 10 * r["median_ms"]} for r in rows]  # another case
    bench.add_ratios(rows + other, copy_gbps=600.0)
    ours = next(r for r in rows if r["variant"] == "gpushape")
    assert ours["speedup_vs_eager"] == pytest.approx(3.0) and ours["pct_copy"] == 0.5
    assert ours["speedup_vs_compile"] == pytest.approx(2.0)
    table = bench.format_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    line = next(t for t in table[2:] if "gpushape" in t)
    assert "0.100" in line and " 300" in line and "50%" in line and " 450" in line
    assert " relu " in line and " nchw " in line
    assert line.rstrip().endswith("3.00")
    assert next(t for t in table[2:] if "eager" in t).rstrip().endswith("1.00")


def test_parse_shapes(bench):
    case = bench.Case
    assert bench.parse_shapes("2x4x8x8:2:relu:nchw,3x64x9x9,1x6x3x4:1:silu:nchw-cl,2x4x2x2:4") == [
        ((2, 4, 8, 8), case(2, "relu", "nchw")),
        ((3, 64, 9, 9), case(32, "none", "nchw")),
        ((1, 6, 3, 4), case(1, "silu", "nchw-cl")),
        ((2, 4, 2, 2), case(4, "none", "nchw")),
    ]
    assert str(case(32, "relu", "nchw")) == "32:relu:nchw"
    with pytest.raises(SystemExit, match="layout 'cl' unknown"):
        bench.parse_shapes("2x4x8x8:2:relu:cl")
    with pytest.raises(SystemExit, match="activation 'tanh' unknown"):
        bench.parse_shapes("2x4x8x8:2:tanh")
    with pytest.raises(SystemExit, match="groups do not divide"):
        bench.parse_shapes("2x6x8x8:4")
    with pytest.raises(SystemExit, match="not N x C x H x W"):
        bench.parse_shapes("2x4x8:1")
    with pytest.raises(SystemExit, match="not NxCxHxW"):
        bench.parse_shapes("2x4x8x8:1:relu:nchw:x")


@pytest.mark.parametrize(
    ("groups", "activation", "layout", "fn"),
    [
        (2, "relu", "nchw", F.relu),
        (1, "none", "nchw", lambda y: y),
        (3, "silu", "nchw-cl", F.silu),
        (6, "gelu_tanh", "nchw", lambda y: F.gelu(y, approximate="tanh")),
    ],
)
def test_eager_variant_is_group_norm_then_the_activation(bench, groups, activation, layout, fn):
    case = bench.Case(groups, activation, layout)
    x, w, b, dy = bench.make_inputs((2, 6, 4, 5), case, "cpu")
    assert isinstance(w, torch.nn.Parameter) and x.is_contiguous(
        memory_format=bench.LAYOUTS[layout]
    )
    assert dy.shape == x.shape and x.dtype == w.dtype == torch.bfloat16
    gn, module, source = bench.eager_modules(case, w, b)
    assert isinstance(gn, torch.nn.GroupNorm) and gn.num_groups == groups and gn.eps == bench.EPS
    assert gn.weight is w and gn.bias is b and "GroupNorm" in source
    y = module(x)
    assert torch.equal(y, fn(F.group_norm(x, groups, w, b, bench.EPS)))
    assert torch.equal(y, bench.torch_group_norm_act(x, w, b, groups, activation))
    _, dw, db = torch.autograd.grad(y, (x, w, b), dy)  # its parameters: ours
    assert dw.shape == db.shape == (6,)


def test_gpushape_variant_shares_the_eager_parameters(bench):
    from gpushape.kernels import GroupNormAct

    case = bench.Case(2, "silu", "nchw")
    _, w, b, _ = bench.make_inputs((2, 4, 3, 3), case, "cpu")
    fns, source = bench.variants(["eager", "gpushape"], case, w, b)
    assert set(fns) == {"eager", "gpushape"} and "SiLU" in source
    ours = fns["gpushape"]
    assert isinstance(ours, GroupNormAct) and ours.weight is w and ours.bias is b


def test_smoke_run_on_cpu(bench, interpret, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--quick", "--variants", "eager,gpushape", "--out", str(out)]
    shapes = "2x4x5x6:2:relu:nchw,2x6x3x4:1:none:nchw,1x8x4x4:4:silu:nchw-cl"
    assert bench.main([*args, "--shapes", shapes]) == 0
    result = json.loads(out.read_text())
    assert "torch" in result["environment"] and len(result["checks"]) == 3
    assert "2x4x5x6:2:relu:nchw" in result["checks"]
    assert all(c.startswith("pass") for c in result["checks"].values())
    assert {
        (r["groups"], r["activation"], r["layout"], r["direction"], r["variant"])
        for r in result["results"]
    } == {
        (*case, d, v)
        for case in ((2, "relu", "nchw"), (1, "none", "nchw"), (4, "silu", "nchw-cl"))
        for d in bench.DIRECTIONS
        for v in ("eager", "gpushape")
    }
    ours = next(r for r in result["results"] if r["variant"] == "gpushape")
    assert ours["kernel_bytes"] == 3 * 2 * 4 * 5 * 6 * 2 and "speedup_vs_eager" in ours
    assert capsys.readouterr().out.strip().splitlines()[-1].lstrip().startswith("1x8x4x4")
